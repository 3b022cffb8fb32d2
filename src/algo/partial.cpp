#include "algo/partial.h"

#include <cstring>

#include "core/error.h"
#include "model/trainable.h"

namespace loco {
namespace {

std::string pack(const float* params, const std::vector<Range>& ranges) {
  std::string out(size_t(total_size(ranges)) * sizeof(float), '\0');
  size_t at = 0;
  for (const auto& r : ranges) {
    std::memcpy(out.data() + at, params + r.begin, size_t(r.size()) * sizeof(float));
    at += size_t(r.size()) * sizeof(float);
  }
  return out;
}

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
  op.gather_handle = comm.all_gather_start(pack(params, op.own), &op.gathered, "outer_gradients");
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
  comm.wait(op.gather_handle);
  check(int(op.gathered.size()) == replicas_, "partial sync: expected a payload from every replica");
  const float trainers = float(replicas_ / slices_);  // m[i] for a sliced entry
  for (int n = 0; n < slices_; ++n) {
    const auto part = intersect_ranges(region, slice_ranges_[size_t(n)]);
    const auto offsets = packed_offsets(region, part);
    const int64_t count = total_size(part);
    std::vector<float> sum(size_t(count), 0.0f);
    for (int r = n; r < replicas_; r += slices_) {  // rank order: the same sum everywhere
      const std::string& payload = op.gathered[size_t(r)];
      check(int64_t(payload.size()) == count * int64_t(sizeof(float)), "partial sync: payload of the wrong size");
      const float* x = reinterpret_cast<const float*>(payload.data());
      for (int64_t i = 0; i < count; ++i) sum[size_t(i)] += x[i];
    }
    size_t at = 0;
    for (size_t i = 0; i < part.size(); ++i)
      for (int64_t j = 0; j < part[i].size(); ++j) avg[size_t(offsets[i] + j)] = sum[at++] / trainers;
  }
  op.shared_values.clear();
  op.gathered.clear();
}

}  // namespace loco
