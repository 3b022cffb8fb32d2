#pragma once
// Codecs for outer gradients (docs/streaming.md, "low-precision outer gradients"). Each
// replica encodes its own, unreduced fragment delta; the payloads are all-gathered and every
// worker decodes and sums them in float32 in rank order, so all get the same result.
//
// Bit layouts (all little-endian; n values, blocks of `block` values, the last one shorter):
//   fp32        n x f32.
//   bf16        n x u16: the upper half of the f32 bit pattern after rounding.
//   fp8         per block: u8 shared exponent E (E8M0: scale 2^(E-127)), then one byte per
//               value in E4M3 (sign, 4 exponent bits with bias 7, 3 mantissa bits; largest
//               finite value 448, no infinities; 0x7F/0xFF are NaN and never produced).
//   fp4-e3m0    per block: u8 shared exponent E (scale 2^(E-127)), then values packed two per
//               byte (low nibble first): sign bit | 3 exponent bits e; e = 0 is zero, e = 1..7
//               is 2^(e-7) x scale, i.e. magnitudes 1/64 .. 1 of the scale. Powers of two only.
//   fp4-e2m1    per block: u8 shared exponent E, then nibbles (low first) in OCP E2M1: sign |
//               2 exponent bits | 1 mantissa bit, magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} x scale.
//   int8        per block: f32 scale s = max|x| / 127, then n x i8 with x ~ q s.
//   random-drop u64 seed, then the kept values as f32, each divided by the keep fraction (an
//               unbiased estimate); which values are kept follows from the seed, so no indices
//               travel.
//   topk        u32 k, then k x (u32 index, f32 value) of the largest magnitudes.
// The shared exponent of a block is the smallest one for which the block's largest magnitude
// fits the format's largest value. Rounding is to nearest (ties to even) or stochastic
// (unbiased: E[decode(encode(x))] = x within the representable range). NaN or infinite inputs
// are rejected with an error.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/rng.h"

namespace loco {

struct CodecConfig {
  std::string format = "fp32";    // fp32, bf16, fp8, fp4-e3m0, fp4-e2m1, int8, random-drop, topk
  std::string rounding = "nearest";  // nearest or stochastic
  int block = 128;                // values per shared scale
  double keep_fraction = 0.1;     // random-drop and topk
};

class Codec {
 public:
  virtual ~Codec() = default;
  // Encodes x[0..n); `rng` drives stochastic rounding and random dropping.
  virtual std::string encode(const float* x, int64_t n, Rng& rng) const = 0;
  // Adds the decoded values to acc[0..n) (fails on a malformed payload).
  virtual void decode_add(const std::string& payload, float* acc, int64_t n) const = 0;
  // The values to encode made piece by piece instead of read from one array: fill(begin, len,
  // out) writes values [begin, begin + len) into out, for disjoint pieces, possibly from several
  // of loco's compute threads at once. The same bytes as encode() of those values (and the same
  // error for a non-finite one); the grid formats with nearest rounding encode each piece as it
  // is made, so the values are never all held (or read twice) at once.
  using Fill = std::function<void(int64_t begin, int64_t len, float* out)>;
  virtual std::string encode_from(int64_t n, const Fill& fill, Rng& rng) const;
  // Whether encode_from encodes the pieces as they are made (else it makes the whole array
  // first, in a new buffer: a caller with one at hand may make the values there and encode()).
  virtual bool encodes_pieces() const { return false; }
  // Values [begin, begin + len) of an n-value payload that passed check_payload, added to
  // acc[0..len): what decode_add adds there, to the bit. begin is a multiple of
  // range_alignment(), which is 0 for a codec that decodes whole payloads only.
  virtual int64_t range_alignment() const { return 0; }
  virtual void decode_add_range(const std::string& payload, int64_t n, int64_t begin, int64_t len, float* acc) const;
  // Fails unless `payload` decodes to n values (its size, and codes the format never produces):
  // what decode_add checks, for a payload decoded elsewhere (loco.torch's outer state on a GPU).
  virtual void check_payload(const std::string& payload, int64_t n) const;
  // Exact payload size in bytes for n values (topk and random-drop: for their kept count).
  virtual int64_t encoded_bytes(int64_t n) const = 0;
  virtual std::string name() const = 0;
  // True when decode(encode(x)) == x for every finite float (fp32).
  virtual bool lossless() const { return false; }
  // The largest |decode(encode(x)) - x| as a fraction of the largest |x| in its block (bf16: of
  // |x| itself). Grid formats: half the widest gap of the grid over half its top value (the
  // block's largest magnitude lies in (top/2, top] x scale), twice that with stochastic
  // rounding; infinity for the codecs that drop values.
  virtual double error_bound() const = 0;
};

std::unique_ptr<Codec> make_codec(const CodecConfig& config);

// How encoded (non-fp32) outer gradients of n values are combined among M workers, and the
// bytes worker `index` sends for one synchronization (the formulas the simulator and estimator
// use too):
//  - all-gather: every worker sends its encoded values to every other and each sums all M in
//    float32 in worker order (the exact sum of what was sent): (M-1) x encoded(n);
//  - reduce-scatter: shard k (values [n k/M, n (k+1)/M)) of every worker goes to worker k, which
//    sums them in float32, re-encodes the mean and sends it to every other worker:
//    sum over k != index of encoded(shard k) + (M-1) x encoded(shard index), about
//    2 (M-1)/M x encoded(n) whatever M, at the price of a second quantization.
enum class EncodedReduce { AllGather, ReduceScatter };
// "auto" (all-gather up to 2 workers, where both send the same bytes and all-gather is exact;
// reduce-scatter above), "all-gather" or "reduce-scatter".
EncodedReduce choose_encoded_reduce(const std::string& setting, int workers);
int64_t shard_begin(int64_t n, int M, int k);
int64_t encoded_sync_bytes(const Codec& codec, EncodedReduce how, int64_t n, int M, int index);

}  // namespace loco
