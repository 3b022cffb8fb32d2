#pragma once
// FLOPs, parameter and memory estimators (docs/simulator.md; partial-updates paper,
// section 3.1 and appendix C.2). Pure arithmetic over an architecture description.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"

namespace loco::sim {

struct Arch {
  double d = 2048, layers = 24, ff = 8192, vocab = 32000, heads = 16;
  double kv_heads = 0;      // key/value heads (grouped-query attention); 0: heads
  double kv_count() const { return kv_heads > 0 ? kv_heads : heads; }
  double kv_width() const { return d * kv_count() / heads; }  // of k and of v
  bool tied = true;
  bool qk_norm = false;
  int mlp_matrices = 2;     // 2: GPT MLP (W, V); 3: SwiGLU (gate, up, down)
  // loco's kernels: causal attention computes 64-row blocks up to the diagonal, and the
  // backward recomputes the scores; otherwise full S x S attention without recomputation.
  bool loco_kernels = false;
};
Arch arch_of(const ModelConfig& c);  // loco's model: SwiGLU, loco kernels
Arch gpt3_xl();                      // the partial-updates paper's 1.3B configuration

struct Slicing {
  int slices = 1;              // N; node k trains slice k mod N
  std::string strategy = "mlp";  // "mlp" or "mlp+heads"
};
void validate_slicing(const Arch& a, const Slicing& s);

struct ParamCounts {
  double total = 0, nonblock = 0, per_block = 0;
  double mlp_per_block = 0, qkv_per_block = 0;  // the sliceable matrices
  double trainable = 0;                         // per node under the slicing
};
ParamCounts param_counts(const Arch& a, const Slicing& s = {});

struct Flops {
  double forward = 0;
  double backward_input = 0;   // gradients with respect to activations (never scaled)
  double backward_params = 0;  // parameter gradients (sliced matrices scaled by 1/N)
  double matmul_forward = 0, matmul_backward = 0;  // the matrix-product part of the above
  double backward() const { return backward_input + backward_params; }
  double total() const { return forward + backward(); }
};
// One training step of `batch` sequences of `seq` tokens on one node.
Flops step_flops(const Arch& a, double batch, double seq, const Slicing& s = {});

struct Memory {
  double weights = 0, grads = 0, master = 0, adam = 0, outer = 0, activations = 0;
  double total() const { return weights + grads + master + adam + outer + activations; }
};
// Bytes per node under the paper's accounting: bf16 weights and gradients, fp32 master weights
// and AdamW moments for trainable parameters, fp32 outer parameters and momentum (all for
// DiLoCo; the largest fragment for streaming and partial), activation checkpointing (bf16
// block inputs plus one block's working set). Partial updates are Streaming DiLoCo over slices s.
enum class MemoryMethod { Ddp, Diloco, Streaming, Partial };
// Rows of `loco sim estimate`'s memory table, in this order, with their labels.
const std::vector<std::pair<MemoryMethod, std::string>>& memory_methods();
Memory memory_per_node(const Arch& a, MemoryMethod method, double batch, double seq, int fragment_layers,
                       const Slicing& s = {});

// Seconds for a bandwidth-optimal ring all-reduce of `bytes` over k nodes at `bits_per_s`.
double ring_allreduce_seconds(double bytes, int k, double bits_per_s);

}  // namespace loco::sim
