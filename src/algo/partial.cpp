#include "algo/partial.h"

#include <algorithm>

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

}  // namespace

CountVectorAverage::CountVectorAverage(const ParamLayout& layout, int slices, const std::string& strategy, int rank,
                                       int replicas)
    : slices_(slices), rank_(rank) {
  check(slices >= 1, "partial.slices must be >= 1");
  if (replicas % slices != 0)
    fail("partial.slices (" + std::to_string(slices) + ") must divide the number of replicas (" +
         std::to_string(replicas) + ")");
  if (slices == 1) return;
  const SliceStrategy s = parse_slice_strategy(strategy);
  for (int n = 0; n < slices; ++n) {
    slice_ranges_.push_back(layout.slice_ranges(n, slices, s));
    for (const auto& r : slice_ranges_.back()) all_sliced_.push_back(r);
  }
  all_sliced_ = merge_ranges(all_sliced_);
  for (int r = rank % slices; r < replicas; r += slices) group_.push_back(r);
  for (int n = 0; n < slices; ++n) column_.push_back(rank / slices * slices + n);
}

void CountVectorAverage::start(Communicator& comm, const float* params, const std::vector<Range>& region,
                               Op& op) const {
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
  op.gather_handle = comm.all_gather_floats_group_start(op.own_values.data(), int64_t(op.own_values.size()),
                                                        &op.gathered, column_, "outer_gradients");
}

void CountVectorAverage::finish(Communicator& comm, Op& op, const std::vector<Range>& region,
                                std::vector<float>& avg) const {
  avg.resize(size_t(total_size(region)));  // every entry is written below: shared, or some slice's
  comm.wait(op.shared_handle);
  place(region, op.shared, op.shared_values.data(), avg);
  if (slices_ == 1) return;
  comm.wait(op.group_handle);
  comm.wait(op.gather_handle);
  check(int(op.gathered.size()) == slices_, "partial sync: expected one payload per slice");
  for (int n = 0; n < slices_; ++n) {  // column member n holds slice n's group average
    const auto part = intersect_ranges(region, slice_ranges_[size_t(n)]);
    const std::string& payload = op.gathered[size_t(n)];
    check(int64_t(payload.size()) == total_size(part) * int64_t(sizeof(float)),
          "partial sync: payload of the wrong size");
    place(region, part, reinterpret_cast<const float*>(payload.data()), avg);
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
  Op op;
  start(comm, params.data(), whole, op);
  finish(comm, op, whole, params);  // the same size: params stays where it is
}

void add_partial_keys(ConfigSchema& s, PartialConfig& pa) {
  s.add("partial.slices", &pa.slices, "N: partial updates, node k trains slice k mod N (1: everything)", 1);
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
