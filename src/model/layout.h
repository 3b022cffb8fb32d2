#pragma once
// Where every parameter lives in the flat parameter buffer (gradients and optimizer state use
// the same offsets in buffers of their own).
//
// Order: non-block tensors first (embed_tokens, lm_head unless tied, final norm), then each
// block contiguously: input_layernorm, q, k, v, [q_norm, k_norm], o, post_attention_layernorm,
// gate, up, down. Matrices are row-major in Hugging Face (out, in) layout except down_proj,
// stored transposed as (f, d) so that a slice of the MLP hidden dimension is a block of rows
// in gate, up and down alike. Consequences:
//   - a fragment (a set of blocks, or the non-block tensors) is one contiguous range per block;
//   - slice n of N (MLP hidden units, or q/k/v heads) is one range per sliced matrix.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"

namespace loco {

// Foreign: a tensor of a model loco does not define (the Python layer's torch modules).
enum class TensorKind { Embedding, LmHead, FinalNorm, InputNorm, Q, K, V, QNorm, KNorm, O, PostNorm, Gate, Up, Down, Foreign };

struct TensorInfo {
  std::string name;     // Hugging Face name
  TensorKind kind;
  int block;            // global block index, -1 for non-block tensors
  int64_t offset;       // in the flat buffer
  int64_t rows, cols;   // as stored (down: (f, d))
  bool transposed;      // stored as the transpose of the Hugging Face (out, in) shape
  bool is_matrix() const { return rows > 1; }  // norm weights are stored as (1, n)
  int64_t numel() const { return rows * cols; }
};

struct Range {
  int64_t begin, end;
  int64_t size() const { return end - begin; }
  bool operator==(const Range&) const = default;
};

// A pipeline stage: blocks [first_block, last_block), with or without embedding and head.
struct StageSpec {
  int first_block = 0;
  int last_block = -1;  // -1: up to num_layers
  bool embedding = true;
  bool head = true;
  // Protocol models (docs/protocol.md, model/protocol.h): with embedding_rank = k > 0 the embedding
  // tensor holds the trainable coordinates E_s (V x k) of E = E_fixed + E_s U^T; o_proj and
  // down_proj of blocks below constrained_end write only into span(U).
  int embedding_rank = 0;
  int constrained_end = 0;
};

// o_proj and down_proj: the matrices that write into the residual stream.
inline bool writes_residual(const TensorInfo& t) { return t.kind == TensorKind::O || t.kind == TensorKind::Down; }
// A matrix kept in the protocol subspace on this stage.
inline bool is_constrained(const StageSpec& stage, const TensorInfo& t) {
  return writes_residual(t) && t.block < stage.constrained_end;
}

enum class SliceStrategy { Mlp, MlpHeads };

// A tensor of a foreign model: its name, the block (fragment unit) it belongs to (-1: none) and
// its shape as (rows, cols) of its elements in storage order. `mlp` marks the projections that
// partial updates slice: "gate" and "up" (f x d, rows = hidden units) and "down" stored
// transposed (f x d: the caller lays its d x f weight's transpose); "q", "k" and "v" (rows =
// the heads' output units, head by head, as in Hugging Face's Llama); "" for every other tensor.
struct ForeignTensor {
  std::string name;
  int block = -1;
  int64_t rows = 0, cols = 0;
  std::string mlp;
};

class ParamLayout {
 public:
  ParamLayout(const ModelConfig& config, StageSpec stage = {});
  // A foreign model's parameters: the non-block tensors first, then blocks 0 .. num_blocks - 1
  // in order, each block's tensors together, as this layout's invariants need (checked: an
  // error names the first tensor out of order, a block without tensors, an empty or duplicate
  // name). Stage: every block, no embedding or head semantics. Partial slicing (strategy mlp)
  // cuts the tensors marked gate/up/down by their rows, the hidden units (every marked tensor must
  // have the same row count f, the layout's intermediate size); strategy mlp+heads also those
  // marked q/k/v, by whole heads: num_heads query heads and num_kv_heads key/value heads (0: as
  // many as the query heads), of q's rows / num_heads units each.
  static ParamLayout foreign(const std::vector<ForeignTensor>& tensors, int num_blocks, int num_heads = 0,
                             int num_kv_heads = 0);

  int64_t size() const { return size_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo& get(TensorKind kind, int block = -1) const;
  const TensorInfo* find(const std::string& name) const;
  const StageSpec& stage() const { return stage_; }
  const ModelConfig& config() const { return config_; }
  int num_blocks() const { return stage_.last_block - stage_.first_block; }

  // Fragment ranges: one range covering all tensors of a block, or the non-block tensors.
  Range block_range(int block) const;
  std::vector<Range> nonblock_ranges() const;
  // Slice n of num_slices of every block in the stage: rows of gate/up/down for the MLP hidden
  // units [n f/N, (n+1) f/N) and, with MlpHeads, rows of q for heads [n h/N, (n+1) h/N) and of
  // k/v for key/value heads [n kv/N, (n+1) kv/N) (the same heads without grouped-query attention;
  // with it, whole groups).
  std::vector<Range> slice_ranges(int n, int num_slices, SliceStrategy strategy) const;
  // The rows of tensor t (as stored) in slice n of num_slices: a row block for the sliced
  // tensors, [0, rows) for every other one.
  std::pair<int64_t, int64_t> slice_rows(const TensorInfo& t, int n, int num_slices, SliceStrategy strategy) const;

 private:
  // Rows per slice of a sliced tensor; 0 for the others. Checks divisibility.
  int64_t slice_height(const TensorInfo& t, int num_slices, SliceStrategy strategy) const;
  void add(const std::string& name, TensorKind kind, int block, int64_t rows, int64_t cols, bool transposed);
  ModelConfig config_;
  StageSpec stage_;
  std::vector<TensorInfo> tensors_;
  std::vector<size_t> block_first_tensor_;  // index into tensors_ of each block's first tensor
  int64_t size_ = 0;
};

std::vector<Range> merge_ranges(std::vector<Range> ranges);
// Runs of values to copy: count values from src + from to dst + to (the runs' destinations
// disjoint). copy_runs splits them over loco's compute threads (a large fragment's copy is bound
// by memory bandwidth, which one thread does not fill).
struct CopyRun {
  int64_t from, to, count;
};
void copy_runs(const float* src, float* dst, const std::vector<CopyRun>& runs);
// Copies params[r.begin, r.end) of every range, in order, into `packed` (resized).
void pack_ranges(const float* params, const std::vector<Range>& ranges, std::vector<float>& packed);
// The inverse: packed values back into params at the ranges.
void unpack_ranges(const float* packed, const std::vector<Range>& ranges, float* params);
// Set operations on sorted, merged range lists.
std::vector<Range> intersect_ranges(const std::vector<Range>& a, const std::vector<Range>& b);
std::vector<Range> subtract_ranges(const std::vector<Range>& a, const std::vector<Range>& b);
int64_t total_size(const std::vector<Range>& ranges);

}  // namespace loco
