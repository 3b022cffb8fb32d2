#!/usr/bin/env bash
# The reproduction study (docs/results/reproduction.md): DDP, DiLoCo, Streaming DiLoCo, partial
# updates, NoLoCo and protocol models on configs/small.toml with the Brown corpus, 4 replicas,
# 1000 steps each, two seeds for the noisiest comparisons, a lone worker, a DiLoCo grid and
# diagnoses, then the papers' claims next to the measurements. Resumable: run it again after an
# interruption and it continues run by run from the last checkpoints. About 4 hours on 2 cores.
#   scripts/reproduce.sh                 run (or continue) the study, then write the page
#   scripts/reproduce.sh --until 500     advance every pending run to step 500 only
#   scripts/reproduce.sh --report-only   regenerate the page from docs/results/reproduction/
#   scripts/reproduce.sh --list          the runs and which are recorded
# Options: scripts/reproduce.sh --help
# The quality-parity study (docs/results/parity.md; scripts/parity.py, about 10 hours on 2 cores,
# resumable the same way) runs with --study parity first:
#   scripts/reproduce.sh --study parity [--list | --report-only | --max-runs N ...]
set -euo pipefail
cd "$(dirname "$0")/.."
study=reproduce data=scripts/brown-data.sh  # the small-batch study, on Brown
if [ "${1:-}" = --study ]; then
  case ${2:-} in
    parity) study=parity data=scripts/code-data.sh ;;
    small-batch) ;;
    *) echo "reproduce.sh: --study takes parity or small-batch" >&2; exit 2 ;;
  esac
  shift 2
fi
# Training needs the build and, with the default config, the study's corpus (its script does both).
setup=data
for a in "$@"; do
  case $a in
    --report-only|--list|--help|-h) setup=none ;;
    --config|--config=*) [[ $setup == data ]] && setup=build ;;
  esac
done
case $setup in
  data) "$data" > /dev/null ;;
  build) scripts/build.sh > /dev/null ;;
esac
exec /usr/bin/python3 "scripts/$study.py" "$@"
