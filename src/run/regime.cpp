#include "run/regime.h"

#include <cstdio>

namespace loco {

namespace {

std::string grouped(int64_t v) {  // 8192 -> "8,192"
  std::string s = std::to_string(v);
  for (int i = int(s.size()) - 3; i > (s[0] == '-' ? 1 : 0); i -= 3) s.insert(size_t(i), ",");
  return s;
}

}  // namespace

std::vector<std::string> regime_warnings(const RunConfig& cfg, int replicas, int64_t params) {
  std::vector<std::string> out;
  const bool low_comm = cfg.method() == MethodId::Diloco || cfg.method() == MethodId::Streaming || cfg.method() == MethodId::Noloco;
  const int64_t per_replica = int64_t(cfg.data.batch_size) * cfg.data.seq_len;
  if (low_comm && replicas > 1 && per_replica < kParityTokensPerReplica)
    out.push_back(cfg.algorithm + " with " + grouped(per_replica) + " tokens per replica per step (fewer than " +
                  grouped(kParityTokensPerReplica) +
                  "): at 20 tokens per parameter, docs/results/parity-32k.md found tuned DiLoCo ending further "
                  "above data-parallel training the fewer tokens each replica gets, more than 3% above below " +
                  grouped(kParityTokensPerReplica) + "; expect the method to trail data-parallel training here");
  const double planned = double(cfg.train.steps) * double(per_replica) * replicas / double(params);
  if (replicas > 1 && params > 0 && planned < kParityTokensPerParam) {
    char b[64];
    std::snprintf(b, sizeof b, "%.2g", planned);
    out.push_back(std::string("a budget of ") + b + " tokens per parameter (fewer than 20, at which the papers "
                  "and docs/results/parity-32k.md compare methods): how methods rank this early need not hold at a "
                  "longer budget");
  }
  return out;
}

}  // namespace loco
