#include "pipeline/grid.h"

#include <limits>

#include "core/error.h"
#include "io/config_schema.h"

namespace loco {

std::vector<int> Grid::stage_group(int stage) const {
  std::vector<int> out;
  for (int r = 0; r < replicas; ++r) out.push_back(rank(stage, r));
  return out;
}

std::vector<int> Grid::replica_chain(int replica) const {
  std::vector<int> out;
  for (int s = 0; s < stages; ++s) out.push_back(rank(s, replica));
  return out;
}

std::string Grid::describe(int r) const {
  if (stages == 1) return "worker " + std::to_string(r);
  return "stage " + std::to_string(stage_of(r)) + ", replica " + std::to_string(replica_of(r)) + " (worker " +
         std::to_string(r) + ")";
}

std::vector<int> parse_split(const std::string& text, int stages, int num_layers, const std::string& key) {
  std::vector<int> counts;
  for (int64_t v : parse_int_list(text, key, 1, "a block count >= 1 (expected e.g. \"2,4\")"))
    counts.push_back(int(std::min<int64_t>(v, num_layers + 1)));
  if (int(counts.size()) != stages)
    fail(key + " lists " + std::to_string(counts.size()) + " stages, pipeline.stages is " + std::to_string(stages));
  int64_t total = 0;
  for (int c : counts) total += c;
  if (total != num_layers)
    fail(key + " assigns " + std::to_string(total) + " blocks, the model has " + std::to_string(num_layers));
  return counts;
}

std::vector<int64_t> stage_param_counts(const ModelConfig& model, const std::vector<StageSpec>& stages) {
  std::vector<int64_t> out;
  for (const auto& s : stages) out.push_back(ParamLayout(model, s).size());
  return out;
}

std::vector<StageSpec> partition_stages(const ModelConfig& model, int S, const std::string& split) {
  const int L = model.num_layers;
  check(S >= 1, "pipeline.stages must be >= 1");
  if (S > L)
    fail("pipeline.stages (" + std::to_string(S) + ") exceeds model.num_layers (" + std::to_string(L) +
         "): every stage needs at least one block");
  std::vector<int> counts;
  if (!split.empty()) {
    counts = parse_split(split, S, L, "pipeline.split");
  } else {
    // Parameters of the blocks and of what the first and last stage add.
    const ParamLayout full(model);
    const int64_t block = full.block_range(0).size();
    const int64_t first_extra = ParamLayout(model, {0, 0, true, false}).size();
    const int64_t last_extra = ParamLayout(model, {L, L, false, true}).size();
    // best[s][k]: smallest largest-stage size of stages 0..s-1 holding the first k blocks.
    const int64_t inf = std::numeric_limits<int64_t>::max();
    std::vector<std::vector<int64_t>> best(size_t(S) + 1, std::vector<int64_t>(size_t(L) + 1, inf));
    std::vector<std::vector<int>> choice(size_t(S) + 1, std::vector<int>(size_t(L) + 1, 0));
    best[0][0] = 0;
    for (int s = 1; s <= S; ++s)
      for (int k = s; k <= L - (S - s); ++k)
        for (int n = k - (s - 1); n >= 1; --n) {  // n blocks on stage s-1; larger n first
          if (best[size_t(s - 1)][size_t(k - n)] == inf) continue;
          int64_t size = int64_t(n) * block;
          if (s == 1) size += first_extra;
          if (s == S) size += last_extra;
          const int64_t worst = std::max(best[size_t(s - 1)][size_t(k - n)], size);
          if (worst < best[size_t(s)][size_t(k)]) {
            best[size_t(s)][size_t(k)] = worst;
            choice[size_t(s)][size_t(k)] = n;
          }
        }
    counts.assign(size_t(S), 0);
    for (int s = S, k = L; s >= 1; --s) {
      counts[size_t(s - 1)] = choice[size_t(s)][size_t(k)];
      k -= counts[size_t(s - 1)];
    }
  }
  std::vector<StageSpec> out;
  int first = 0;
  for (int s = 0; s < S; ++s) {
    out.push_back({first, first + counts[size_t(s)], s == 0, s == S - 1});
    first += counts[size_t(s)];
  }
  return out;
}

}  // namespace loco
