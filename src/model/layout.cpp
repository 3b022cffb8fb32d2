#include "model/layout.h"

#include <algorithm>
#include <set>

#include "core/error.h"
#include "core/parallel.h"

namespace loco {

ParamLayout::ParamLayout(const ModelConfig& c, StageSpec stage) : config_(c), stage_(stage) {
  if (stage_.last_block < 0) stage_.last_block = c.num_layers;
  check(stage_.first_block >= 0 && stage_.first_block <= stage_.last_block && stage_.last_block <= c.num_layers,
        "stage blocks [" + std::to_string(stage_.first_block) + ", " + std::to_string(stage_.last_block) +
            ") are outside the model's " + std::to_string(c.num_layers) + " layers");
  const int64_t d = c.hidden_size, f = c.intermediate_size, v = c.vocab_size, hd = c.head_dim(), kv = c.kv_dim();
  if (stage_.embedding || (stage_.head && c.tie_embeddings))
    add("model.embed_tokens.weight", TensorKind::Embedding, -1, v, stage_.embedding_rank > 0 ? stage_.embedding_rank : d,
        false);
  if (stage_.head && !c.tie_embeddings) add("lm_head.weight", TensorKind::LmHead, -1, v, d, false);
  if (stage_.head) add("model.norm.weight", TensorKind::FinalNorm, -1, 1, d, false);
  for (int l = stage_.first_block; l < stage_.last_block; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    block_first_tensor_.push_back(tensors_.size());
    add(p + "input_layernorm.weight", TensorKind::InputNorm, l, 1, d, false);
    add(p + "self_attn.q_proj.weight", TensorKind::Q, l, d, d, false);
    add(p + "self_attn.k_proj.weight", TensorKind::K, l, kv, d, false);
    add(p + "self_attn.v_proj.weight", TensorKind::V, l, kv, d, false);
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", TensorKind::QNorm, l, 1, hd, false);
      add(p + "self_attn.k_norm.weight", TensorKind::KNorm, l, 1, hd, false);
    }
    add(p + "self_attn.o_proj.weight", TensorKind::O, l, d, d, false);
    add(p + "post_attention_layernorm.weight", TensorKind::PostNorm, l, 1, d, false);
    add(p + "mlp.gate_proj.weight", TensorKind::Gate, l, f, d, false);
    add(p + "mlp.up_proj.weight", TensorKind::Up, l, f, d, false);
    add(p + "mlp.down_proj.weight", TensorKind::Down, l, f, d, true);
  }
}

ParamLayout ParamLayout::foreign(const std::vector<ForeignTensor>& tensors, int num_blocks, int num_heads,
                                 int num_kv_heads) {
  check(num_blocks >= 0, "a model's block count must be >= 0");
  ModelConfig c;
  c.num_layers = num_blocks;
  ParamLayout out(c, StageSpec{0, 0, false, false});  // no tensors; the stage is every block
  out.config_.intermediate_size = 0;                  // the MLP projections' (below), if any
  out.stage_.last_block = num_blocks;
  std::set<std::string> names;
  int block = -1;
  int64_t head_width = 0;  // of the attention projections' heads, once one is seen
  for (const auto& t : tensors) {
    check(!t.name.empty(), "a parameter without a name");
    check(names.insert(t.name).second, "parameter " + t.name + " appears twice");
    check(t.rows >= 1 && t.cols >= 1, "parameter " + t.name + " has no elements");
    check(t.block >= -1 && t.block < num_blocks,
          "parameter " + t.name + ": block " + std::to_string(t.block) + " is outside [0, " +
              std::to_string(num_blocks) + ")");
    check(t.block == block || t.block == block + 1,
          "parameter " + t.name + " is out of order: non-block parameters first, then blocks 0, 1, ... each together");
    if (t.block != block) out.block_first_tensor_.push_back(out.tensors_.size());
    block = t.block;
    TensorKind kind = TensorKind::Foreign;
    if (t.mlp == "q" || t.mlp == "k" || t.mlp == "v") {
      check(t.block >= 0, "parameter " + t.name + ": an attention projection must belong to a block");
      check(num_heads > 0, "parameter " + t.name + " is marked " + t.mlp + ", and the head count is not given");
      const int kv = num_kv_heads > 0 ? num_kv_heads : num_heads;
      check(num_heads % kv == 0, "the query heads (" + std::to_string(num_heads) +
                                     ") must be a multiple of the key/value heads (" + std::to_string(kv) + ")");
      const int64_t heads = t.mlp == "q" ? num_heads : kv;
      check(t.rows % heads == 0, "parameter " + t.name + ": " + std::to_string(t.rows) + " rows are not " +
                                     std::to_string(heads) + " heads of equal width");
      const int64_t width = t.rows / heads;
      check(head_width == 0 || head_width == width, "parameter " + t.name + ": heads of " + std::to_string(width) +
                                                        " units, another projection's have " +
                                                        std::to_string(head_width));
      head_width = width;
      out.config_.num_heads = num_heads;
      out.config_.num_kv_heads = kv;
      out.config_.hidden_size = int(width * num_heads);  // so that head_dim() is the heads' width
      kind = t.mlp == "q" ? TensorKind::Q : t.mlp == "k" ? TensorKind::K : TensorKind::V;
    } else if (!t.mlp.empty()) {
      check(t.mlp == "gate" || t.mlp == "up" || t.mlp == "down",
            "parameter " + t.name + ": mlp must be \"gate\", \"up\", \"down\", \"q\", \"k\", \"v\" or \"\", got \"" +
                t.mlp + "\"");
      check(t.block >= 0, "parameter " + t.name + ": an MLP projection must belong to a block");
      check(out.config_.intermediate_size == 0 || out.config_.intermediate_size == t.rows,
            "parameter " + t.name + ": " + std::to_string(t.rows) + " hidden units, another MLP projection has " +
                std::to_string(out.config_.intermediate_size));
      out.config_.intermediate_size = int(t.rows);
      kind = t.mlp == "gate" ? TensorKind::Gate : t.mlp == "up" ? TensorKind::Up : TensorKind::Down;
    }
    out.add(t.name, kind, t.block, t.rows, t.cols, t.mlp == "down");
  }
  check(block == num_blocks - 1, "blocks " + std::to_string(block + 1) + " .. " + std::to_string(num_blocks - 1) +
                                     " have no parameters");
  return out;
}

void ParamLayout::add(const std::string& name, TensorKind kind, int block, int64_t rows, int64_t cols,
                      bool transposed) {
  tensors_.push_back({name, kind, block, size_, rows, cols, transposed});
  size_ += rows * cols;
}

const TensorInfo& ParamLayout::get(TensorKind kind, int block) const {
  for (const auto& t : tensors_)
    if (t.kind == kind && t.block == block) return t;
  fail("internal: tensor kind " + std::to_string(int(kind)) + " of block " + std::to_string(block) +
       " is not in this stage");
}

const TensorInfo* ParamLayout::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

Range ParamLayout::block_range(int block) const {
  check(block >= stage_.first_block && block < stage_.last_block,
        "block " + std::to_string(block) + " is not in this stage");
  const size_t i = size_t(block - stage_.first_block);
  const int64_t begin = tensors_[block_first_tensor_[i]].offset;
  const int64_t end = i + 1 < block_first_tensor_.size() ? tensors_[block_first_tensor_[i + 1]].offset : size_;
  return {begin, end};
}

std::vector<Range> ParamLayout::nonblock_ranges() const {
  std::vector<Range> out;
  for (const auto& t : tensors_)
    if (t.block < 0) out.push_back({t.offset, t.offset + t.numel()});
  return merge_ranges(out);
}

int64_t ParamLayout::slice_height(const TensorInfo& t, int num_slices, SliceStrategy strategy) const {
  check(num_slices >= 1, "slice count must be >= 1");
  const int64_t f = config_.intermediate_size, h = config_.num_heads, kv = config_.kv_heads(), hd = config_.head_dim();
  check(f % num_slices == 0, "partial.slices (" + std::to_string(num_slices) +
                                 ") must divide the MLP hidden size " + std::to_string(f));
  // With grouped-query attention a slice holds whole groups: key/value heads [n kv/N, (n+1) kv/N)
  // and the query heads that read them, [n h/N, (n+1) h/N).
  if (strategy == SliceStrategy::MlpHeads)
    check(kv % num_slices == 0, "partial.slices (" + std::to_string(num_slices) +
                                    ") must divide the number of key/value heads " + std::to_string(kv));
  int64_t rows_per_slice = 0;
  switch (t.kind) {
    case TensorKind::Gate:
    case TensorKind::Up:
    case TensorKind::Down:
      rows_per_slice = f / num_slices;
      break;
    case TensorKind::Q:
      if (strategy == SliceStrategy::MlpHeads) rows_per_slice = h / num_slices * hd;
      break;
    case TensorKind::K:
    case TensorKind::V:
      if (strategy == SliceStrategy::MlpHeads) rows_per_slice = kv / num_slices * hd;
      break;
    default:
      break;
  }
  return rows_per_slice;
}

std::pair<int64_t, int64_t> ParamLayout::slice_rows(const TensorInfo& t, int n, int num_slices,
                                                   SliceStrategy strategy) const {
  check(n >= 0 && n < num_slices, "slice index out of range");
  const int64_t h = slice_height(t, num_slices, strategy);
  if (h == 0) return {0, t.rows};
  return {n * h, (n + 1) * h};
}

std::vector<Range> ParamLayout::slice_ranges(int n, int num_slices, SliceStrategy strategy) const {
  std::vector<Range> out;
  for (const auto& t : tensors_) {
    if (slice_height(t, num_slices, strategy) == 0) continue;  // not a sliced tensor
    const auto [r0, r1] = slice_rows(t, n, num_slices, strategy);
    out.push_back({t.offset + r0 * t.cols, t.offset + r1 * t.cols});
  }
  return merge_ranges(out);
}

void copy_runs(const float* src, float* dst, const std::vector<CopyRun>& runs) {
  std::vector<int64_t> start(runs.size() + 1, 0);  // each run's first position in the split order
  for (size_t k = 0; k < runs.size(); ++k) start[k + 1] = start[k] + runs[k].count;
  parallel_for(start.back(), 1 << 18, [&](int64_t b, int64_t e) {
    size_t k = size_t(std::upper_bound(start.begin(), start.end(), b) - start.begin()) - 1;
    for (; k < runs.size() && start[k] < e; ++k) {
      const int64_t lo = std::max(b, start[k]) - start[k], hi = std::min(e, start[k + 1]) - start[k];
      if (hi > lo) std::copy_n(src + runs[k].from + lo, hi - lo, dst + runs[k].to + lo);
    }
  });
}

namespace {

// Each range's run between the flat buffer and the packed values (from_flat: packing).
std::vector<CopyRun> packed_runs(const std::vector<Range>& ranges, bool from_flat) {
  std::vector<CopyRun> runs;
  int64_t at = 0;
  for (const auto& r : ranges) {
    runs.push_back(from_flat ? CopyRun{r.begin, at, r.size()} : CopyRun{at, r.begin, r.size()});
    at += r.size();
  }
  return runs;
}

}  // namespace

void pack_ranges(const float* params, const std::vector<Range>& ranges, std::vector<float>& packed) {
  packed.resize(size_t(total_size(ranges)));
  copy_runs(params, packed.data(), packed_runs(ranges, true));
}

void unpack_ranges(const float* packed, const std::vector<Range>& ranges, float* params) {
  copy_runs(packed, params, packed_runs(ranges, false));
}

std::vector<Range> intersect_ranges(const std::vector<Range>& a, const std::vector<Range>& b) {
  std::vector<Range> out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t lo = std::max(a[i].begin, b[j].begin), hi = std::min(a[i].end, b[j].end);
    if (lo < hi) out.push_back({lo, hi});
    (a[i].end < b[j].end ? i : j)++;
  }
  return out;
}

std::vector<Range> subtract_ranges(const std::vector<Range>& a, const std::vector<Range>& b) {
  std::vector<Range> out;
  size_t j = 0;
  for (Range r : a) {
    while (j < b.size() && b[j].end <= r.begin) ++j;
    for (size_t k = j; k < b.size() && b[k].begin < r.end; ++k) {
      if (b[k].begin > r.begin) out.push_back({r.begin, b[k].begin});
      r.begin = std::max(r.begin, b[k].end);
    }
    if (r.begin < r.end) out.push_back(r);
  }
  return out;
}

std::vector<Range> merge_ranges(std::vector<Range> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  std::vector<Range> out;
  for (const auto& r : ranges) {
    if (r.size() <= 0) continue;
    if (!out.empty() && out.back().end >= r.begin)
      out.back().end = std::max(out.back().end, r.end);
    else
      out.push_back(r);
  }
  return out;
}

int64_t total_size(const std::vector<Range>& ranges) {
  int64_t s = 0;
  for (const auto& r : ranges) s += r.size();
  return s;
}

}  // namespace loco
