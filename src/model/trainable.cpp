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

TrainableSet::TrainableSet(const ParamLayout& layout, int slice, int slices, const std::string& strategy)
    : slice_(slice), slices_(slices) {
  const SliceStrategy s = parse_slice_strategy(strategy);
  // The layout checks divisibility and describes the slice as ranges; here the same slice is
  // kept per tensor as a row range.
  layout.slice_ranges(slice, slices, s);
  const auto& c = layout.tensors();
  std::vector<TensorRows> rows;
  for (const auto& t : c) {
    bool sliced = t.kind == TensorKind::Gate || t.kind == TensorKind::Up || t.kind == TensorKind::Down;
    if (s == SliceStrategy::MlpHeads)
      sliced = sliced || t.kind == TensorKind::Q || t.kind == TensorKind::K || t.kind == TensorKind::V;
    if (!sliced || slices == 1) {
      rows.push_back({0, t.rows, 0});
    } else {
      const int64_t per = t.rows / slices;
      rows.push_back({slice * per, (slice + 1) * per, 0});
    }
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
