#pragma once
// The parameters one node trains (partial parameter updates, docs/partial.md). Node k
// trains slice n = k mod N of every block's MLP (rows of gate/up and of the transposed down)
// and, with heads, of q/k/v; every other tensor is trained everywhere. Gradients and optimizer
// state exist only for the trained entries: a compact buffer holding, in layout order, the
// trained rows of each tensor.
#include <cstdint>
#include <string>
#include <vector>

#include "model/layout.h"

namespace loco {

class TrainableSet {
 public:
  // Everything trainable: the compact buffer is the layout itself.
  explicit TrainableSet(const ParamLayout& layout);
  // Slice `slice` of `slices` under `strategy` ("mlp" or "mlp+heads").
  TrainableSet(const ParamLayout& layout, int slice, int slices, const std::string& strategy);

  struct TensorRows {
    int64_t begin = 0, end = 0;  // trained rows of the tensor as stored
    int64_t compact = 0;         // offset of their gradient in the compact buffer
  };
  const TensorRows& rows(size_t tensor_index) const { return rows_[tensor_index]; }
  // Trained ranges of the flat parameter buffer (sorted, merged) and their compact offsets.
  const std::vector<Range>& ranges() const { return ranges_; }
  const std::vector<int64_t>& compact_offsets() const { return compact_offsets_; }
  int64_t size() const { return size_; }
  bool full() const { return full_; }

 private:
  void build(const ParamLayout& layout, const std::vector<TensorRows>& rows);
  std::vector<TensorRows> rows_;
  std::vector<Range> ranges_;
  std::vector<int64_t> compact_offsets_;
  int64_t size_ = 0;
  bool full_ = true;
};

SliceStrategy parse_slice_strategy(const std::string& name);

}  // namespace loco
