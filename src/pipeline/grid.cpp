#include "pipeline/grid.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/lists.h"

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
  for (const auto& s : stages)
    out.push_back(int64_t(model.stage_parameter_count(s.last_block - s.first_block, s.embedding, s.head)));
  return out;
}

namespace {

// Blocks per stage whose largest stage is as small as possible. Every block has the same size B;
// stage 0 adds the embedding, the last stage the head. A bound T admits at most
// floor((T - extra_s) / B) blocks on stage s: the smallest feasible T is found by bisection,
// then stages give back blocks, fullest (and, among equals, latest) first, until they hold L.
std::vector<int> balanced_counts(const ModelConfig& model, int S, int L) {
  std::vector<double> extra(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) extra[size_t(s)] = model.stage_parameter_count(0, s == 0, s == S - 1);
  const double B = model.block_parameter_count();
  auto capacity = [&](double T) {
    std::vector<int> n(static_cast<size_t>(S));
    for (int s = 0; s < S; ++s)
      n[size_t(s)] = int(std::min<double>(L, std::floor((T - extra[size_t(s)]) / B + 1e-9)));
    return n;
  };
  auto feasible = [&](double T) {
    int64_t total = 0;
    for (int n : capacity(T)) {
      if (n < 1) return false;
      total += n;
    }
    return total >= L;
  };
  // Candidate bounds are extra_s + k B; bisect k over each form and keep the smallest.
  double best = std::numeric_limits<double>::infinity();
  for (int s = 0; s < S; ++s) {
    int64_t lo = 1, hi = L;
    if (!feasible(extra[size_t(s)] + double(hi) * B)) continue;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (feasible(extra[size_t(s)] + double(mid) * B)) hi = mid;
      else lo = mid + 1;
    }
    best = std::min(best, extra[size_t(s)] + double(lo) * B);
  }
  std::vector<int> n = capacity(best);
  int64_t total = 0;
  for (int x : n) total += x;
  for (; total > L; --total) {
    int fullest = 0;
    for (int s = 0; s < S; ++s)
      if (n[size_t(s)] >= n[size_t(fullest)]) fullest = s;
    --n[size_t(fullest)];
  }
  return n;
}

}  // namespace

std::vector<StageSpec> partition_stages(const ModelConfig& model, int S, const std::string& split) {
  const int L = model.num_layers;
  check(S >= 1, "pipeline.stages must be >= 1");
  if (S > L)
    fail("pipeline.stages (" + std::to_string(S) + ") exceeds model.num_layers (" + std::to_string(L) +
         "): every stage needs at least one block");
  const std::vector<int> counts = !split.empty() ? parse_split(split, S, L, "pipeline.split")
                                  : S == 1        ? std::vector<int>{L}
                                                  : balanced_counts(model, S, L);
  std::vector<StageSpec> out;
  int first = 0;
  for (int s = 0; s < S; ++s) {
    out.push_back({first, first + counts[size_t(s)], s == 0, s == S - 1});
    first += counts[size_t(s)];
  }
  return out;
}

}  // namespace loco
