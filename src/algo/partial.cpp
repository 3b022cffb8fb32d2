#include "algo/partial.h"


#include "core/error.h"
#include "model/trainable.h"

namespace loco {
namespace {

// Position of each range of `part` within the packed order of `region` (part is a subset).
std::vector<int64_t> packed_offsets(const std::vector<Range>& region, const std::vector<Range>& part) {
  std::vector<int64_t> out;
  size_t i = 0;
  int64_t base = 0;
  for (const auto& r : part) {
    while (region[i].end <= r.begin) base += region[i++].size();
    out.push_back(base + (r.begin - region[i].begin));
  }
  return out;
}

}  // namespace

CountVectorAverage::CountVectorAverage(const ParamLayout& layout, int slices, const std::string& strategy, int rank,
                                       int replicas)
    : slices_(slices), rank_(rank), replicas_(replicas) {
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
  op.shared_values.resize(size_t(total_size(op.shared)));
  size_t at = 0;
  for (const auto& r : op.shared) {
    std::copy(params + r.begin, params + r.end, op.shared_values.begin() + std::ptrdiff_t(at));
    at += size_t(r.size());
  }
  op.shared_handle = comm.all_reduce_start(op.shared_values.data(), int64_t(op.shared_values.size()), ReduceOp::Mean,
                                           "outer_gradients");
  if (slices_ == 1) return;
  op.own = intersect_ranges(region, slice_ranges_[size_t(rank_ % slices_)]);
  op.own_values.resize(size_t(total_size(op.own)));
  at = 0;
  for (const auto& r : op.own) {
    std::copy(params + r.begin, params + r.end, op.own_values.begin() + std::ptrdiff_t(at));
    at += size_t(r.size());
  }
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
  {
    const auto offsets = packed_offsets(region, op.shared);
    size_t at = 0;
    for (size_t i = 0; i < op.shared.size(); ++i) {
      std::copy_n(op.shared_values.begin() + std::ptrdiff_t(at), op.shared[i].size(), avg.begin() + offsets[i]);
      at += size_t(op.shared[i].size());
    }
  }
  if (slices_ == 1) return;
  comm.wait(op.group_handle);
  comm.wait(op.gather_handle);
  check(int(op.gathered.size()) == slices_, "partial sync: expected one payload per slice");
  for (int n = 0; n < slices_; ++n) {  // column member n holds slice n's group average
    const auto part = intersect_ranges(region, slice_ranges_[size_t(n)]);
    const auto offsets = packed_offsets(region, part);
    const std::string& payload = op.gathered[size_t(n)];
    check(int64_t(payload.size()) == total_size(part) * int64_t(sizeof(float)),
          "partial sync: payload of the wrong size");
    const float* x = reinterpret_cast<const float*>(payload.data());
    for (size_t i = 0; i < part.size(); ++i) {
      std::copy_n(x, part[i].size(), avg.begin() + offsets[i]);
      x += part[i].size();
    }
  }
  op.shared_values.clear();
  op.own_values.clear();
  op.gathered.clear();
}

}  // namespace loco
