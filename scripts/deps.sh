# Sourced by the other scripts: installs Debian packages by group, idempotently.
# Only runs apt-get (update first) when a package of the group is missing.
loco_packages() {
  case $1 in
    build) echo build-essential cmake pkg-config libopenblas-dev nlohmann-json3-dev libcli11-dev \
                libtomlplusplus-dev libgtest-dev libsentencepiece-dev \
                libopenmpi-dev openmpi-bin zlib1g-dev libhiredis-dev libsodium-dev libdnnl-dev \
                python3-dev pybind11-dev ;;
    test) echo python3 python3-numpy python3-torch python3-protobuf python3-pyflakes gnuplot-nox iproute2 iputils-ping chromium redis-server redis-tools ;;
    netlab) echo iproute2 iputils-ping ;;
    elastic) echo redis-server redis-tools ;;
    demo) echo gnuplot-nox ;;
    plot) echo gnuplot-nox ;;
    fuzz) echo clang libfuzzer-14-dev libclang-rt-14-dev ;;
    corpus) echo python3 ;;
    npm) echo npm ;;
    kjv) echo bible-kjv ;;
    code) echo linux-source-6.1 xz-utils python3 ;;
  esac
}

loco_install() {
  local missing=()
  for group in "$@"; do
    for p in $(loco_packages "$group"); do
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing: ${missing[*]}"
  local sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
}
