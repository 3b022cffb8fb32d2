#pragma once
// Transformer kernels as forward/backward pairs of free functions over flat row-major
// buffers. Shapes are in the comment of each pair; N is the number of token rows (B*T).
// Conventions:
//  - forward writes its outputs (overwrite);
//  - backward ACCUMULATES (+=) into every gradient it produces, so that gradients of shared
//    inputs (residual stream, tied embeddings, micro-batches) add up;
//  - a null gradient pointer means "not needed" (frozen weight, or an input with no upstream).
// Templated on the scalar so that the gradient tests can run every kernel in double.
#include <cstdint>

namespace loco {

// out (N, C) = in * rstd * w; rstd (N) = 1 / sqrt(mean(in^2) + eps).
template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* in, const T* w, int64_t n, int c, T eps);
// din (N, C) += ..., dw (C) += ...
template <class T>
void rmsnorm_backward(T* din, T* dw, const T* dout, const T* in, const T* w, const T* rstd, int64_t n, int c);

// Linear with weight in Hugging Face layout W (OUT, IN): out (N, OUT) = in (N, IN) W^T.
template <class T>
void linear_forward(T* out, const T* in, const T* w, int64_t n, int in_dim, int out_dim);
// din (N, IN) += dout W; dw (OUT, IN) += dout^T in.
template <class T>
void linear_backward(T* din, T* dw, const T* dout, const T* in, const T* w, int64_t n, int in_dim, int out_dim);

// Rows [r0, r1) of dw only: dw_rows (r1 - r0, IN) += dout[:, r0:r1]^T in. For partial updates:
// the weight gradient of a trained slice, without computing the frozen rest.
template <class T>
void linear_backward_weight_rows(T* dw_rows, const T* dout, const T* in, int64_t n, int in_dim, int out_dim, int r0,
                                 int r1);

// Linear with weight stored transposed, Wt (IN, OUT): out (N, OUT) = in (N, IN) Wt.
// Used for down_proj so that a slice of the hidden (IN) dimension is a block of rows.
template <class T>
void linear_t_forward(T* out, const T* in, const T* wt, int64_t n, int in_dim, int out_dim);
// din (N, IN) += dout Wt^T; dwt (IN, OUT) += in^T dout.
template <class T>
void linear_t_backward(T* din, T* dwt, const T* dout, const T* in, const T* wt, int64_t n, int in_dim, int out_dim);
// Rows [r0, r1) of dwt only: dwt_rows (r1 - r0, OUT) += in[:, r0:r1]^T dout.
template <class T>
void linear_t_backward_weight_rows(T* dwt_rows, const T* dout, const T* in, int64_t n, int in_dim, int out_dim,
                                   int r0, int r1);

// out (N, C) = E[tokens] with E (V, C).
template <class T>
void embedding_forward(T* out, const int32_t* tokens, const T* e, int64_t n, int c);
// dE[tokens[i]] += dout[i].
template <class T>
void embedding_backward(T* de, const T* dout, const int32_t* tokens, int64_t n, int c);

// Rotary position embedding, rotate-half convention, on x (B*S, H*Dh) viewed as heads of Dh;
// the position of row r is r mod S. cos/sin tables are (S, Dh/2).
template <class T>
void rope_tables(T* cos_table, T* sin_table, int seq, int head_dim, double theta);
template <class T>
void rope_forward(T* out, const T* in, const T* cos_table, const T* sin_table, int64_t batch, int seq, int heads,
                  int head_dim);
// din += R^T dout.
template <class T>
void rope_backward(T* din, const T* dout, const T* cos_table, const T* sin_table, int64_t batch, int seq, int heads,
                   int head_dim);

// Causal multi-head attention. q, out: (B*S, H*Dh); k, v: (B*S, KV*Dh) with KV key/value
// heads dividing H, query head h reading key/value head h / (H / KV) (grouped-query attention;
// KV = H: one each). lse: (B, H, S) log-sum-exp of each score row, kept so that backward
// recomputes the probabilities instead of storing them.
// Works on blocks of query rows against the keys they can see, so at most one (rows x S)
// score block per (batch, head) exists at a time, in a per-thread scratch buffer; (batch, head)
// pairs run in parallel.
template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, int64_t batch, int seq, int heads,
                       int kv_heads, int head_dim);
// dq (B*S, H*Dh), dk, dv (B*S, KV*Dh) +=. (batch, key/value head) pairs run in parallel, each
// adding its query heads' contributions in order, so the result does not depend on threads.
template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                        const T* lse, int64_t batch, int seq, int heads, int kv_heads, int head_dim);

// SwiGLU activation: out (N, F) = silu(gate) * up.
template <class T>
void swiglu_forward(T* out, const T* gate, const T* up, int64_t count);
// dgate, dup += ...
template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t count);

// Mean token cross-entropy plus z-loss: loss = mean_i (lse_i - logits[i, t_i]) + z * mean_i lse_i^2.
// Writes lse (N), the log-sum-exp of each row, for the backward pass. Returns the loss.
// Targets must be < V (checked by callers).
template <class T>
double cross_entropy_forward(T* lse, const T* logits, const int32_t* targets, int64_t n, int vocab, double z_loss);
// dlogits (N, V) = dloss * d(loss)/d(logits). The one kernel that overwrites instead of
// accumulating: the logits are the only input of the loss, and dlogits may alias logits so the
// (N x V) buffer is reused for its own gradient.
template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const T* lse, const int32_t* targets, int64_t n, int vocab,
                            double z_loss, double dloss);
// Both in one pass over each row while it is in cache: returns the forward's loss and overwrites
// logits with the backward's dlogits, bit for bit what the two kernels give. target_logit (N):
// scratch, each row's logit at its target, read before the row is overwritten.
template <class T>
double cross_entropy_fused(T* logits, T* lse, T* target_logit, const int32_t* targets, int64_t n, int vocab,
                           double z_loss, double dloss);

}  // namespace loco
