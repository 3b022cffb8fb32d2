#include "algo/partial.h"

#include <algorithm>
#include <cstring>

#include "algo/partial_config.h"
#include "algo/run_config.h"
#include "core/error.h"
#include "model/trainable.h"

namespace loco {
namespace {

// Writes `values` (packed over `part`, a subset of `region`) to their places in `avg`, which
// is packed over `region`.
void place(const std::vector<Range>& region, const std::vector<Range>& part, const float* values,
           std::vector<float>& avg) {
  std::vector<CopyRun> runs;
  size_t i = 0;
  int64_t base = 0, at = 0;  // packed offsets of region[i] in avg and of r in values
  for (const auto& r : part) {
    while (region[i].end <= r.begin) base += region[i++].size();
    runs.push_back({at, base + (r.begin - region[i].begin), r.size()});
    at += r.size();
  }
  copy_runs(values, avg.data(), runs);
}

// Whether member m is the first (lowest-ranked) member training its slice: the one that sends
// the slice's average to all.
bool first_trainer(const std::vector<int>& slice_of, int m) {
  return std::find(slice_of.begin(), slice_of.end(), slice_of[size_t(m)]) - slice_of.begin() == m;
}

}  // namespace

CountVectorAverage::CountVectorAverage(const ParamLayout& layout, int slices, const std::string& strategy)
    : slices_(slices), rank_(0) {
  check(slices >= 1, "partial.slices must be >= 1");
  if (slices == 1) return;
  const SliceStrategy s = parse_slice_strategy(strategy);
  for (int n = 0; n < slices; ++n) {
    slice_ranges_.push_back(layout.slice_ranges(n, slices, s));
    for (const auto& r : slice_ranges_.back()) all_sliced_.push_back(r);
  }
  all_sliced_ = merge_ranges(all_sliced_);
}

CountVectorAverage::CountVectorAverage(const ParamLayout& layout, int slices, const std::string& strategy, int rank,
                                       int replicas)
    : CountVectorAverage(layout, slices, strategy) {
  if (replicas % slices != 0)
    fail("partial.slices (" + std::to_string(slices) + ") must divide the number of replicas (" +
         std::to_string(replicas) + ")");
  rank_ = rank;
  if (slices == 1) return;
  for (int r = rank % slices; r < replicas; r += slices) group_.push_back(r);
  for (int n = 0; n < slices; ++n) column_.push_back(rank / slices * slices + n);
}

CountVectorAverage CountVectorAverage::among_members(const ParamLayout& layout, int slices, const std::string& strategy,
                                                     int slice) {
  CountVectorAverage a(layout, slices, strategy);
  check(slice >= 0 && slice < slices, "internal: slice out of range");
  a.rank_ = slice;
  a.among_ = slices > 1;
  return a;
}

void CountVectorAverage::start_among(Communicator& comm, const float* params, const std::vector<Range>& region,
                                     Op& op) const {
  // Every member's slice: checked before use (a peer's bytes).
  const int M = comm.size();
  std::vector<std::string> slices;
  auto h = comm.all_gather_direct_start(std::string(reinterpret_cast<const char*>(&rank_), sizeof rank_), &slices,
                                        "partial_slices");
  comm.wait(h);
  op.slice_of.assign(size_t(M), -1);
  for (int m = 0; m < M; ++m) {
    const int n = parse_slice(slices[size_t(m)], slices_);
    if (n < 0)
      throw PeerError("partial sync: member " + std::to_string(m) + " sent no valid slice (of " +
                          std::to_string(slices_) + ")",
                      {m});
    op.slice_of[size_t(m)] = n;
  }
  op.shared = subtract_ranges(region, all_sliced_);
  pack_ranges(params, op.shared, op.shared_values);
  op.shared_handle = comm.all_reduce_start(op.shared_values.data(), int64_t(op.shared_values.size()), ReduceOp::Mean,
                                           "outer_gradients");
  std::vector<int> group;  // the members training this member's slice
  for (int m = 0; m < M; ++m)
    if (op.slice_of[size_t(m)] == rank_) group.push_back(m);
  op.own = intersect_ranges(region, slice_ranges_[size_t(rank_)]);
  pack_ranges(params, op.own, op.own_values);
  if (group.size() > 1)
    op.group_handle = comm.all_reduce_group_start(op.own_values.data(), int64_t(op.own_values.size()), ReduceOp::Mean,
                                                  group, "outer_gradients");
  // Runs after the group reduction: the leaders forward its result, the others send nothing.
  std::vector<int> everyone(static_cast<size_t>(M));
  std::vector<int64_t> counts(static_cast<size_t>(M), 0);  // each slice's average from its first trainer
  for (int m = 0; m < M; ++m) {
    everyone[size_t(m)] = m;
    if (first_trainer(op.slice_of, m))
      counts[size_t(m)] = total_size(intersect_ranges(region, slice_ranges_[size_t(op.slice_of[size_t(m)])]));
  }
  op.gather_handle =
      comm.all_gather_floats_group_start(op.own_values.data(), counts, &op.gathered, everyone, "outer_gradients");
  // The slices nobody in the round trains keep their entries (frozen everywhere since the round began).
  std::vector<Range> untrained;
  for (int n = 0; n < slices_; ++n)
    if (std::find(op.slice_of.begin(), op.slice_of.end(), n) == op.slice_of.end())
      for (const auto& r : intersect_ranges(region, slice_ranges_[size_t(n)])) untrained.push_back(r);
  pack_ranges(params, merge_ranges(untrained), op.kept);
}

void CountVectorAverage::finish_among(Communicator& comm, Op& op, const std::vector<Range>& region,
                                      std::vector<float>& avg) const {
  avg.resize(size_t(total_size(region)));  // every entry is written below
  comm.wait(op.shared_handle);
  place(region, op.shared, op.shared_values.data(), avg);
  if (op.group_handle.valid()) comm.wait(op.group_handle);
  comm.wait(op.gather_handle);
  // The gathered floats: each slice's average from its first trainer, in member order (sizes
  // checked piece by piece as they arrived).
  std::vector<Range> untrained;
  const float* at = op.gathered.data();
  for (int m = 0; m < int(op.slice_of.size()); ++m) {
    if (!first_trainer(op.slice_of, m)) continue;
    const auto part = intersect_ranges(region, slice_ranges_[size_t(op.slice_of[size_t(m)])]);
    place(region, part, at, avg);
    at += total_size(part);
  }
  for (int n = 0; n < slices_; ++n)
    if (std::find(op.slice_of.begin(), op.slice_of.end(), n) == op.slice_of.end())
      for (const auto& r : intersect_ranges(region, slice_ranges_[size_t(n)])) untrained.push_back(r);
  place(region, merge_ranges(untrained), op.kept.data(), avg);
  op.shared_values.clear();
  op.own_values.clear();
  op.gathered.clear();
  op.kept.clear();
}

void CountVectorAverage::start(Communicator& comm, const float* params, const std::vector<Range>& region,
                               Op& op) const {
  if (among_) {
    start_among(comm, params, region, op);
    return;
  }
  op.shared = slices_ == 1 ? region : subtract_ranges(region, all_sliced_);
  pack_ranges(params, op.shared, op.shared_values);
  op.shared_handle = comm.all_reduce_start(op.shared_values.data(), int64_t(op.shared_values.size()), ReduceOp::Mean,
                                           "outer_gradients");
  if (slices_ == 1) return;
  op.own = intersect_ranges(region, slice_ranges_[size_t(rank_ % slices_)]);
  pack_ranges(params, op.own, op.own_values);
  op.group_handle = comm.all_reduce_group_start(op.own_values.data(), int64_t(op.own_values.size()), ReduceOp::Mean,
                                                group_, "outer_gradients");
  // Runs after the group reduction (operations run in order): forwards its result.
  std::vector<int64_t> counts(static_cast<size_t>(slices_));  // column member n: slice n's entries of the region
  for (int n = 0; n < slices_; ++n) counts[size_t(n)] = total_size(intersect_ranges(region, slice_ranges_[size_t(n)]));
  op.gather_handle =
      comm.all_gather_floats_group_start(op.own_values.data(), counts, &op.gathered, column_, "outer_gradients");
}

void CountVectorAverage::finish(Communicator& comm, Op& op, const std::vector<Range>& region,
                                std::vector<float>& avg) const {
  if (among_) {
    finish_among(comm, op, region, avg);
    return;
  }
  avg.resize(size_t(total_size(region)));  // every entry is written below: shared, or some slice's
  comm.wait(op.shared_handle);
  place(region, op.shared, op.shared_values.data(), avg);
  if (slices_ == 1) return;
  comm.wait(op.group_handle);
  comm.wait(op.gather_handle);
  const float* at = op.gathered.data();
  for (int n = 0; n < slices_; ++n) {  // column member n held slice n's group average
    const auto part = intersect_ranges(region, slice_ranges_[size_t(n)]);
    place(region, part, at, avg);
    at += total_size(part);
  }
  op.shared_values.clear();
  op.own_values.clear();
  op.gathered.clear();
}

void CountVectorAverage::average_in_place(Communicator& comm, std::vector<float>& params) const {
  if (slices_ == 1) {
    comm.all_reduce(params.data(), int64_t(params.size()), ReduceOp::Mean, "outer_gradients");
    return;
  }
  const std::vector<Range> whole{{0, int64_t(params.size())}};
  start(comm, params.data(), whole, kept_op_);
  finish(comm, kept_op_, whole, params);  // the same size: params stays where it is
}

int parse_slice(const std::string& bytes, int N) {
  int32_t n = -1;
  if (bytes.size() == sizeof n) std::memcpy(&n, bytes.data(), sizeof n);
  return n >= 0 && n < N ? n : -1;
}

CountVectorAverage count_vector_average(const RunConfig& cfg, const Worker& w, bool members_change) {
  if (members_change && cfg.partial.slices > 1)
    return CountVectorAverage::among_members(w.layout(), cfg.partial.slices, cfg.partial.strategy, w.slice);
  return CountVectorAverage(w.layout(), cfg.partial.slices, cfg.partial.strategy, w.rank, w.replicas);
}

void add_partial_keys(ConfigSchema& s, PartialConfig& pa) {
  s.add("partial.slices", &pa.slices, "N: partial updates, node k trains slice k mod N (elastic: slice (member id - 1) mod N; 1: everything)", 1);
  s.add("partial.strategy", &pa.strategy, "sliced matrices: mlp (gate/up/down) or mlp+heads (also q/k/v)",
        {"mlp", "mlp+heads"});
}

void check_partial_config(const RunConfig& c, const ConfigCheck& need) {
  if (c.partial.slices > 1) {
    need(c.method() == MethodId::Diloco || c.method() == MethodId::Streaming,
         "partial.slices > 1 needs algorithm = \"diloco\" or \"streaming\"");
    need(c.model.intermediate_size % c.partial.slices == 0,
         "partial.slices must divide model.intermediate_size (" + std::to_string(c.model.intermediate_size) + ")");
    need(c.partial.strategy == "mlp" || c.model.kv_heads() % c.partial.slices == 0,
         c.model.num_kv_heads > 0 ? "partial.slices must divide model.num_kv_heads (" +
                                        std::to_string(c.model.num_kv_heads) + ") with strategy mlp+heads"
                                  : "partial.slices must divide model.num_heads (" +
                                        std::to_string(c.model.num_heads) + ")");
    need(c.method() != MethodId::Streaming || c.outer.codec == "fp32",
         "partial updates with streaming send float32 (outer.codec = \"fp32\")");
  }
}

}  // namespace loco
