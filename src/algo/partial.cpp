#include "algo/partial.h"

#include <algorithm>

#include "core/error.h"
#include "model/trainable.h"

namespace loco {
namespace {

// Writes `values` (packed over `part`, a subset of `region`) to their places in `avg`, which
// is packed over `region`.
void place(const std::vector<Range>& region, const std::vector<Range>& part, const float* values,
           std::vector<float>& avg) {
  size_t i = 0;
  int64_t base = 0;  // packed offset of region[i]
  for (const auto& r : part) {
    while (region[i].end <= r.begin) base += region[i++].size();
    std::copy_n(values, r.size(), avg.begin() + base + (r.begin - region[i].begin));
    values += r.size();
  }
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
  avg.assign(size_t(total_size(region)), 0.0f);
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

}  // namespace loco
