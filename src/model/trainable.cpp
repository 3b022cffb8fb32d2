#include "model/trainable.h"

#include "core/error.h"

namespace loco {

SliceStrategy parse_slice_strategy(const std::string& name) {
  if (name == "mlp") return SliceStrategy::Mlp;
  if (name == "mlp+heads") return SliceStrategy::MlpHeads;
  fail("partial.strategy must be \"mlp\" or \"mlp+heads\", got \"" + name + "\"");
}

TrainableSet::TrainableSet(const ParamLayout& layout) {
  std::vector<TensorRows> rows;
  for (const auto& t : layout.tensors()) rows.push_back({0, t.rows, 0});
  build(layout, rows);
}

TrainableSet::TrainableSet(const ParamLayout& layout, int slice, int slices, const std::string& strategy) {
  const SliceStrategy s = parse_slice_strategy(strategy);
  std::vector<TensorRows> rows;
  for (const auto& t : layout.tensors()) {
    const auto [r0, r1] = layout.slice_rows(t, slice, slices, s);
    rows.push_back({r0, r1, 0});
  }
  build(layout, rows);
}

void TrainableSet::build(const ParamLayout& layout, const std::vector<TensorRows>& rows) {
  rows_ = rows;
  std::vector<Range> ranges;
  size_ = 0;
  full_ = true;
  for (size_t i = 0; i < rows_.size(); ++i) {
    const auto& t = layout.tensors()[i];
    auto& r = rows_[i];
    r.compact = size_;
    size_ += (r.end - r.begin) * t.cols;
    if (r.begin != 0 || r.end != t.rows) full_ = false;
    if (r.end > r.begin) ranges.push_back({t.offset + r.begin * t.cols, t.offset + r.end * t.cols});
  }
  ranges_ = merge_ranges(ranges);
  compact_offsets_.clear();
  int64_t at = 0;
  for (const auto& r : ranges_) {
    compact_offsets_.push_back(at);
    at += r.size();
  }
}

}  // namespace loco
