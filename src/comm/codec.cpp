#include "comm/codec.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <functional>
#include <cmath>
#include <limits>
#include <cstring>
#include <iterator>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/finite.h"
#include "core/parallel.h"

namespace loco {

namespace {

// Values per chunk of loco's compute threads. Encoding and decoding split the values (or whole
// blocks of block-scaled formats) over the threads only where no random numbers are drawn
// (nearest rounding): each value's or block's bytes and sums then do not depend on the split,
// so a payload is the same whatever the thread count. Stochastic rounding draws from one
// stream, in order, on the calling thread.
constexpr int64_t kChunkValues = 1 << 18;

void for_chunks(int64_t items, int64_t grain, bool split, const std::function<void(int64_t, int64_t)>& fn) {
  if (split) {
    parallel_for(items, grain, fn);
  } else if (items > 0) {
    fn(0, items);
  }
}

// fn(k, begin, len) for every block k of `block` values of [0, n) (the last may be shorter), in
// chunks of whole blocks as for_chunks splits them.
void for_blocks(int64_t n, int block, bool split, const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  for_chunks((n + block - 1) / block, std::max<int64_t>(1, kChunkValues / block), split, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) fn(k, k * block, std::min<int64_t>(block, n - k * block));
  });
}

[[noreturn]] void non_finite(float v, int64_t i) {
  fail("outer gradient contains a non-finite value (" + std::to_string(v) + ") at index " + std::to_string(i) +
       "; refusing to encode it");
}

void check_finite(const float* x, int64_t n) {
  const int64_t i = first_non_finite(x, n);
  if (i >= 0) non_finite(x[i], i);
}

// Values per piece that Codec::encode_from makes at a time and encodes while they are in the
// core's cache (rounded to whole blocks).
constexpr int64_t kPieceValues = 1 << 12;

// check_finite over the values fill() makes: the first non-finite one, in order.
void check_finite_from(int64_t n, const Codec::Fill& fill) {
  std::vector<float> piece(size_t(std::min(n, kPieceValues)));
  for (int64_t b = 0; b < n; b += kPieceValues) {
    const int64_t len = std::min(kPieceValues, n - b);
    fill(b, len, piece.data());
    for (int64_t i = 0; i < len; ++i)
      if (!std::isfinite(piece[size_t(i)])) non_finite(piece[size_t(i)], b + i);
  }
}

void malformed(const std::string& codec, const std::string& what) {
  fail("codec " + codec + ": malformed payload (" + what + ")");
}

template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

template <class T>
T get(const std::string& in, size_t& at, const std::string& codec) {
  if (at + sizeof(T) > in.size()) malformed(codec, "truncated");
  T v;
  std::memcpy(&v, in.data() + at, sizeof(T));
  at += sizeof(T);
  return v;
}

class Fp32 : public Codec {
 public:
  std::string encode(const float* x, int64_t n, Rng&) const override {
    check_finite(x, n);
    return std::string(reinterpret_cast<const char*>(x), size_t(n) * 4);
  }
  void decode_add(const std::string& p, float* acc, int64_t n) const override {
    if (int64_t(p.size()) != 4 * n) malformed(name(), "size");
    parallel_for(n, kChunkValues, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        float v;
        std::memcpy(&v, p.data() + 4 * i, 4);
        acc[i] += v;
      }
    });
  }
  int64_t encoded_bytes(int64_t n) const override { return 4 * n; }
  std::string name() const override { return "fp32"; }
  double error_bound() const override { return 0; }
  bool lossless() const override { return true; }
};

class Bf16 : public Codec {
 public:
  explicit Bf16(bool stochastic) : stochastic_(stochastic) {}
  std::string encode(const float* x, int64_t n, Rng& rng) const override {
    check_finite(x, n);
    std::string out(size_t(n) * 2, '\0');
    char* o = out.data();
    for_chunks(n, kChunkValues, !stochastic_, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        uint32_t u = std::bit_cast<uint32_t>(x[i]);
        // Nearest: add half an ulp of bf16 (ties to even); stochastic: add uniform random low bits.
        const uint32_t add = stochastic_ ? uint32_t(rng.next_u64() & 0xFFFF) : 0x7FFFu + ((u >> 16) & 1u);
        const uint64_t sum = uint64_t(u) + add;
        // Saturate instead of rounding a finite value up to infinity.
        const uint32_t r = (((sum >> 16) & 0x7F80u) == 0x7F80u) ? (u & 0xFFFF0000u) : uint32_t(sum);
        const uint16_t h = uint16_t(r >> 16);
        std::memcpy(o + 2 * i, &h, 2);
      }
    });
    return out;
  }
  void decode_add(const std::string& p, float* acc, int64_t n) const override {
    if (int64_t(p.size()) != 2 * n) malformed(name(), "size");
    parallel_for(n, kChunkValues, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        uint16_t h;
        std::memcpy(&h, p.data() + 2 * i, 2);
        acc[i] += std::bit_cast<float>(uint32_t(h) << 16);
      }
    });
  }
  int64_t encoded_bytes(int64_t n) const override { return 2 * n; }
  std::string name() const override { return "bf16"; }
  double error_bound() const override { return std::ldexp(1.0, stochastic_ ? -7 : -8); }

 private:
  bool stochastic_;
};

std::vector<float> e4m3_grid();

// Block-scaled formats whose codes index a sorted grid of non-negative magnitudes, with a
// power-of-two (E8M0) scale per block.
class GridCodec : public Codec {
 public:
  GridCodec(std::string name, std::vector<float> grid, int bits, int block, bool stochastic)
      : name_(std::move(name)), grid_(std::move(grid)), bits_(bits), block_(block), stochastic_(stochastic) {
    check(grid_.size() <= size_t(sign_bit()) && (bits_ == 8 || grid_.size() == size_t(sign_bit())),
          "internal: codec " + name_ + "'s grid does not fit its codes");
    signed_.assign(size_t(1) << bits_, 0.0f);
    for (size_t code = 0; code < signed_.size(); ++code) {
      const size_t mag = code & (sign_bit() - 1u);
      if (mag < grid_.size()) signed_[code] = (code & sign_bit()) ? -grid_[mag] : grid_[mag];
    }
    // Nearest rounding to a grid of 8 by counting midpoints (encode_nearest8), where that gives
    // quantize()'s codes: each midpoint exact in float, and each interval [a, b) past the first
    // with b <= 2a, so that quantize()'s y - a and b - y are exact (Sterbenz) and its comparison
    // of them is the comparison of y with the midpoint (for the first, a = 0: y - 0 is exact,
    // and b - y is exact for y >= b / 2 and at least b / 2 > y below). Both grids of 8 qualify.
    by_midpoints_ = !stochastic_ && bits_ == 4 && grid_.size() == kGrid8 && grid_[0] == 0.0f;
    for (size_t k = 0; by_midpoints_ && k + 1 < grid_.size(); ++k) {
      const float a = grid_[k], b = grid_[k + 1], sum = a + b;
      mid_[k] = sum / 2;
      by_midpoints_ = a < b && sum - a == b && sum - b == a && (k == 0 || b <= 2 * a);
    }
    // fp8's grid is E4M3's (e4m3_grid()): nearest rounding by its bits (encode_nearest_e4m3).
    by_bits_ = !stochastic_ && bits_ == 8 && grid_ == e4m3_grid();
  }

  std::string encode(const float* x, int64_t n, Rng& rng) const override {
    check_finite(x, n);
    std::string out(size_t(encoded_bytes(n)), '\0');
    auto* o = reinterpret_cast<uint8_t*>(out.data());
    const int64_t per_block = block_bytes(block_);  // every block but the last is whole
    for_blocks(n, block_, !stochastic_, [&](int64_t k, int64_t b0, int64_t len) {
      encode_any(x + b0, len, o + k * per_block, rng);
    });
    return out;
  }

  // Nearest rounding: each piece encoded as fill() makes it, the pieces (whole blocks) split
  // over the threads as encode() splits the blocks, so the same bytes.
  bool encodes_pieces() const override { return !stochastic_; }
  std::string encode_from(int64_t n, const Fill& fill, Rng& rng) const override {
    if (stochastic_) return Codec::encode_from(n, fill, rng);
    std::string out(size_t(encoded_bytes(n)), '\0');
    auto* o = reinterpret_cast<uint8_t*>(out.data());
    const int64_t per_block = block_bytes(block_), per_piece = std::max<int64_t>(1, kPieceValues / block_);
    std::atomic<bool> finite{true};
    for_chunks((n + block_ - 1) / block_, std::max<int64_t>(1, kChunkValues / block_), true, [&](int64_t k0, int64_t k1) {
      std::vector<float> piece(size_t(std::min(k1 - k0, per_piece) * block_));
      for (int64_t kp = k0; kp < k1 && finite; kp += per_piece) {
        const int64_t kq = std::min(k1, kp + per_piece), b0 = kp * block_, len = std::min(n, kq * block_) - b0;
        fill(b0, len, piece.data());
        if (!all_finite(piece.data(), len)) {
          finite = false;
          return;
        }
        for (int64_t k = kp; k < kq; ++k) {
          const float* x = piece.data() + (k - kp) * block_;
          encode_any(x, std::min<int64_t>(block_, n - k * block_), o + k * per_block, rng);
        }
      }
    });
    if (!finite) check_finite_from(n, fill);  // fails, naming the first non-finite value
    return out;
  }

  void decode_add(const std::string& p, float* acc, int64_t n) const override {
    if (int64_t(p.size()) != encoded_bytes(n)) malformed(name_, "size");
    const auto* in = reinterpret_cast<const uint8_t*>(p.data());
    const int64_t per_block = block_bytes(block_);
    for_blocks(n, block_, true, [&](int64_t k, int64_t b0, int64_t len) { decode_block(in + k * per_block, len, acc + b0); });
  }

  int64_t range_alignment() const override { return block_; }
  void decode_add_range(const std::string& p, int64_t n, int64_t begin, int64_t len, float* acc) const override {
    check(begin % block_ == 0 && begin >= 0 && len >= 0 && begin + len <= n && int64_t(p.size()) == encoded_bytes(n),
          "internal: " + name_ + " decodes whole blocks of a payload");
    const auto* in = reinterpret_cast<const uint8_t*>(p.data());
    const int64_t per_block = block_bytes(block_);
    for (int64_t b = begin; b < begin + len; b += block_) {
      const int64_t m = std::min<int64_t>(block_, begin + len - b);
      if (m < block_ && b + m < n) fail("internal: " + name_ + " decodes whole blocks of a payload");
      decode_block(in + (b / block_) * per_block, m, acc + (b - begin));
    }
  }

  // The shared exponent's byte is at most 254 (s <= 127: 255 would scale by 2^128, infinity), and
  // fp8's codes 0x7F and 0xFF (NaN) are never produced; every 4-bit code has a value.
  void check_payload(const std::string& p, int64_t n) const override {
    Codec::check_payload(p, n);
    const auto* in = reinterpret_cast<const uint8_t*>(p.data());
    const int64_t per_block = block_bytes(block_);
    for_blocks(n, block_, true, [&](int64_t k, int64_t, int64_t len) {
      const uint8_t* blk = in + k * per_block;
      if (blk[0] == 255) malformed(name_, "scale out of range");
      if (bits_ == 8)
        for (int64_t i = 1; i <= len; ++i)
          if ((blk[i] & 0x7F) >= grid_.size()) malformed(name_, "code out of range");
    });
  }

  int64_t encoded_bytes(int64_t n) const override {
    const int64_t full = n / block_, rest = n % block_;
    return full * block_bytes(block_) + (rest ? block_bytes(rest) : 0);
  }
  std::string name() const override { return name_; }
  double error_bound() const override {
    // The shared exponent puts the block's largest magnitude in (top/2, top] x scale.
    float gap = 0;
    for (size_t i = 1; i < grid_.size(); ++i) gap = std::max(gap, grid_[i] - grid_[i - 1]);
    return (stochastic_ ? 2.0 : 1.0) * double(gap) / double(grid_.back());
  }

 private:
  uint8_t sign_bit() const { return uint8_t(1u << (bits_ - 1)); }
  int64_t block_bytes(int64_t len) const { return 1 + (bits_ == 8 ? len : (len + 1) / 2); }

  // One block of len values into out (zeroed, block_bytes(len) long), by the quickest way that
  // gives its rounding's codes.
  void encode_any(const float* x, int64_t len, uint8_t* out, Rng& rng) const {
    if (by_midpoints_)
      encode_nearest8(x, len, out);
    else if (by_bits_)
      encode_nearest_e4m3(x, len, out);
    else
      encode_block(x, len, out, rng);
  }

  // A block's len values added to out.
  void decode_block(const uint8_t* blk, int64_t len, float* out) const {
    if (blk[0] == 255) malformed(name_, "scale out of range");  // as check_payload
    const float scale = std::ldexp(1.0f, int(blk[0]) - 127);
    const uint8_t* codes = blk + 1;
    // signed_[code] * scale is the value, to the bit: -(g s) = (-g) s.
    if (bits_ == 8) {
      for (int64_t i = 0; i < len; ++i) {
        if ((codes[i] & 0x7F) >= grid_.size()) malformed(name_, "code out of range");
        out[i] += signed_[codes[i]] * scale;
      }
    } else {  // every 4-bit code has a value (grids of 8)
      for (int64_t i = 0; i + 1 < len; i += 2) {
        const uint8_t byte = codes[i / 2];
        out[i] += signed_[byte & 0x0F] * scale;
        out[i + 1] += signed_[byte >> 4] * scale;
      }
      if (len % 2 == 1) out[len - 1] += signed_[codes[len / 2] & 0x0F] * scale;
    }
  }

  // One block of len values into out (zeroed, block_bytes(len) long): its shared exponent, then
  // the codes (4-bit ones two per byte, the first in the low nibble).
  void encode_block(const float* x, int64_t len, uint8_t* out, Rng& rng) const {
    const float inv_scale = block_scale(x, len, out);
    uint8_t* codes = out + 1;
    for (int64_t i = 0; i < len; ++i) {
      const float v = x[i];
      const uint8_t code = uint8_t(quantize(std::abs(v) * inv_scale, rng) | (std::signbit(v) ? sign_bit() : 0));
      if (bits_ == 8)
        codes[i] = code;
      else
        codes[i / 2] |= uint8_t(i % 2 == 0 ? code : code << 4);
    }
  }

  // encode_block with nearest rounding to a grid of 8 (by_midpoints_), in loops the compiler
  // vectorizes: a value's code is the number of midpoints below it, plus one at a midpoint above
  // an odd code (the tie to the even code), which is quantize()'s code (the constructor says why).
  void encode_nearest8(const float* x, int64_t len, uint8_t* out) const {
    const float inv_scale = block_scale(x, len, out);
    uint8_t* codes = out + 1;
    constexpr int64_t kPiece = 256;  // codes made, then packed two per byte
    // The codes are counted in 32-bit lanes (the midpoints in locals): counted in bytes, the
    // compiler narrowed each comparison's mask to bytes first, and the encoding took about 1.5
    // times as long.
    uint32_t piece[kPiece];
    float mid[kGrid8 - 1];
    std::copy(std::begin(mid_), std::end(mid_), mid);
    for (int64_t p0 = 0; p0 < len; p0 += kPiece) {
      const int64_t m = std::min(kPiece, len - p0);
      const float* v = x + p0;
      for (int64_t i = 0; i < m; ++i) {
        const uint32_t u = std::bit_cast<uint32_t>(v[i]);
        const float y = std::bit_cast<float>(u & 0x7FFFFFFFu) * inv_scale;
        int32_t c = int32_t((u >> 31) << 3);  // the sign bit of a 4-bit code
        for (size_t k = 0; k + 1 < kGrid8; ++k) c += int32_t(y > mid[k]) + int32_t((k % 2 == 1) & (y == mid[k]));
        piece[i] = uint32_t(c);
      }
      uint8_t* o = codes + p0 / 2;  // p0 is even: whole bytes
      for (int64_t j = 0; j < m / 2; ++j) o[j] = uint8_t(piece[2 * j] | (piece[2 * j + 1] << 4));
      if (m % 2 == 1) o[m / 2] = piece[m - 1];
    }
  }

  // encode_block with nearest rounding to E4M3 (by_bits_), in a loop the compiler vectorizes. A
  // value y = |x| / scale below 2^-6 (E4M3's subnormals, codes 0 to 8, spaced 2^-9) has the code
  // y 2^9 rounded to the nearest integer, a tie to the even one (2^23 added and taken away in
  // float); above, y's float32 bits rounded to 3 mantissa bits, a tie to the even one, are the
  // code's exponent and mantissa once the exponent is rebiased (127 to 7), the carry of a
  // rounding up going into the exponent; past the grid's top (448, code 126) the top. Both are
  // quantize()'s nearest grid value with a tie to the even code (the grid is sorted by code, and
  // a code's parity is its mantissa's): gtest Codec.NearestRoundingMatchesAReferenceAtEveryTieAndEdge checks it.
  void encode_nearest_e4m3(const float* x, int64_t len, uint8_t* out) const {
    const float inv_scale = block_scale(x, len, out);
    uint8_t* codes = out + 1;
    const float two23 = 8388608.0f, smallest_normal = 0.015625f;  // 2^23, 2^-6
    for (int64_t i = 0; i < len; ++i) {
      const uint32_t u = std::bit_cast<uint32_t>(x[i]);
      const float y = std::bit_cast<float>(u & 0x7FFFFFFFu) * inv_scale;
      const uint32_t sub = uint32_t((y * 512.0f + two23) - two23);
      const uint32_t b = std::bit_cast<uint32_t>(y);
      const uint32_t normal = ((b + 0x7FFFFu + ((b >> 20) & 1u)) >> 20) - (120u << 3);
      const uint32_t code = y < smallest_normal ? sub : std::min(normal, 126u);
      codes[i] = uint8_t(code | ((u >> 31) << 7));
    }
  }

  // A block's shared exponent into out[0] (max|x| as the largest of the magnitudes' bits: the same
  // order for finite values); returns 1 / its scale.
  float block_scale(const float* x, int64_t len, uint8_t* out) const {
    uint32_t top = 0;
    for (int64_t i = 0; i < len; ++i) top = std::max(top, std::bit_cast<uint32_t>(x[i]) & 0x7FFFFFFFu);
    const int s = shared_exponent(std::bit_cast<float>(top) / grid_.back());
    out[0] = uint8_t(s + 127);
    return std::ldexp(1.0f, -s);
  }

  // Smallest s with 2^s >= t (t = max|x| / largest grid value), clamped to the E8M0 range.
  static int shared_exponent(float t) {
    if (t <= 0) return -127;
    int e;
    const float m = std::frexp(t, &e);  // t = m 2^e, m in [0.5, 1)
    const int s = m == 0.5f ? e - 1 : e;
    return std::clamp(s, -127, 127);
  }

  int quantize(float y, Rng& rng) const {
    const int last = int(grid_.size()) - 1;
    if (y >= grid_[size_t(last)]) return last;
    // grid_[lo] <= y < grid_[lo + 1], by a binary search without branches (grid_[0] = 0 <= y).
    const float* base = grid_.data();
    for (size_t len = grid_.size(); len > 1;) {
      const size_t half = len / 2;
      base = base[half] <= y ? base + half : base;
      len -= half;
    }
    const int lo = int(base - grid_.data());
    const float a = grid_[size_t(lo)], b = grid_[size_t(lo) + 1];
    if (stochastic_) return rng.uniform() < double(y - a) / double(b - a) ? lo + 1 : lo;
    // The nearer grid value; a tie goes to the even code.
    const float below = y - a, above = b - y;
    return lo + int((below > above) | ((below == above) & (lo % 2 == 1)));
  }

  static constexpr size_t kGrid8 = 8;
  std::string name_;
  std::vector<float> grid_;
  std::vector<float> signed_;  // by code: the grid value with the code's sign (unused codes: 0)
  int bits_, block_;
  bool stochastic_;
  bool by_midpoints_ = false;  // encode_nearest8 encodes
  bool by_bits_ = false;       // encode_nearest_e4m3 encodes
  float mid_[kGrid8 - 1] = {};
};

std::vector<float> e4m3_grid() {
  std::vector<float> g;
  for (int c = 0; c < 127; ++c) {  // 0x7F is NaN
    const int e = c >> 3, m = c & 7;
    g.push_back(e == 0 ? std::ldexp(float(m), -9) : std::ldexp(1.0f + float(m) / 8.0f, e - 7));
  }
  return g;
}

std::vector<float> e3m0_grid() {
  std::vector<float> g = {0.0f};
  for (int e = 1; e <= 7; ++e) g.push_back(std::ldexp(1.0f, e - 7));
  return g;
}

class Int8 : public Codec {
 public:
  Int8(int block, bool stochastic) : block_(block), stochastic_(stochastic) {}
  std::string encode(const float* x, int64_t n, Rng& rng) const override {
    check_finite(x, n);
    std::string out(size_t(encoded_bytes(n)), '\0');
    char* o = out.data();
    for_blocks(n, block_, !stochastic_, [&](int64_t k, int64_t b0, int64_t len) {
      char* blk = o + k * (4 + block_);  // every block but the last is whole
      float maxabs = 0;
      for (int64_t i = 0; i < len; ++i) maxabs = std::max(maxabs, std::abs(x[b0 + i]));
      const float scale = maxabs / 127.0f;
      std::memcpy(blk, &scale, 4);
      for (int64_t i = 0; i < len; ++i) {
        const float y = scale > 0 ? x[b0 + i] / scale : 0.0f;
        float q = stochastic_ ? std::floor(y + float(rng.uniform())) : std::nearbyint(y);
        q = std::clamp(q, -127.0f, 127.0f);
        blk[4 + i] = char(int8_t(q));
      }
    });
    return out;
  }
  void decode_add(const std::string& p, float* acc, int64_t n) const override {
    if (int64_t(p.size()) != encoded_bytes(n)) malformed(name(), "size");
    for_blocks(n, block_, true, [&](int64_t k, int64_t b0, int64_t len) {
      const char* blk = p.data() + k * (4 + block_);
      const float scale = scale_of(blk);
      for (int64_t i = 0; i < len; ++i) acc[b0 + i] += float(int8_t(blk[4 + i])) * scale;
    });
  }
  void check_payload(const std::string& p, int64_t n) const override {
    Codec::check_payload(p, n);
    for_blocks(n, block_, true, [&](int64_t k, int64_t, int64_t) { scale_of(p.data() + k * (4 + block_)); });
  }
  int64_t encoded_bytes(int64_t n) const override { return n + 4 * ((n + block_ - 1) / block_); }
  std::string name() const override { return "int8"; }
  // A block's scale: max |x| / 127 when encoded, so finite and >= 0; anything else is malformed.
  float scale_of(const char* blk) const {
    float scale;
    std::memcpy(&scale, blk, 4);
    if (!(scale >= 0 && scale <= std::numeric_limits<float>::max())) malformed(name(), "scale out of range");
    return scale;
  }
  double error_bound() const override { return (stochastic_ ? 1.0 : 0.5) / 127.0; }

 private:
  int block_;
  bool stochastic_;
};

int64_t kept_count(int64_t n, double fraction) {
  return n == 0 ? 0 : std::clamp<int64_t>(int64_t(std::llround(fraction * double(n))), 1, n);
}

// Exactly k indices chosen uniformly at random (partial Fisher-Yates), sorted.
std::vector<int64_t> random_subset(int64_t n, int64_t k, uint64_t seed) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), int64_t(0));
  Rng r(seed);
  for (int64_t i = 0; i < k; ++i) {
    const int64_t j = i + int64_t(r.next_u64() % uint64_t(n - i));
    std::swap(idx[size_t(i)], idx[size_t(j)]);
  }
  idx.resize(size_t(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

class RandomDrop : public Codec {
 public:
  explicit RandomDrop(double keep) : keep_(keep) {}
  std::string encode(const float* x, int64_t n, Rng& rng) const override {
    check_finite(x, n);
    const uint64_t seed = rng.next_u64();
    const int64_t k = kept_count(n, keep_);
    const float rescale = float(double(n) / double(k));  // unbiased
    std::string out;
    put<uint64_t>(out, seed);
    for (int64_t i : random_subset(n, k, seed)) put<float>(out, x[i] * rescale);
    return out;
  }
  void decode_add(const std::string& p, float* acc, int64_t n) const override {
    if (int64_t(p.size()) != encoded_bytes(n)) malformed(name(), "size");
    size_t at = 0;
    const uint64_t seed = get<uint64_t>(p, at, name());
    for (int64_t i : random_subset(n, kept_count(n, keep_), seed)) acc[i] += get<float>(p, at, name());
  }
  int64_t encoded_bytes(int64_t n) const override { return 8 + 4 * kept_count(n, keep_); }
  std::string name() const override { return "random-drop"; }
  double error_bound() const override { return std::numeric_limits<double>::infinity(); }

 private:
  double keep_;
};

class TopK : public Codec {
 public:
  explicit TopK(double keep) : keep_(keep) {}
  std::string encode(const float* x, int64_t n, Rng&) const override {
    check_finite(x, n);
    const int64_t k = kept_count(n, keep_);
    std::vector<int64_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), int64_t(0));
    std::nth_element(idx.begin(), idx.begin() + k - (k > 0), idx.end(), [&](int64_t a, int64_t b) {
      const float fa = std::abs(x[a]), fb = std::abs(x[b]);
      return fa != fb ? fa > fb : a < b;
    });
    idx.resize(size_t(k));
    std::sort(idx.begin(), idx.end());
    std::string out;
    put<uint32_t>(out, uint32_t(k));
    for (int64_t i : idx) {
      put<uint32_t>(out, uint32_t(i));
      put<float>(out, x[i]);
    }
    return out;
  }
  void decode_add(const std::string& p, float* acc, int64_t n) const override {
    size_t at = 0;
    const uint32_t k = get<uint32_t>(p, at, name());
    if (int64_t(k) != kept_count(n, keep_) || p.size() != 4 + 8 * size_t(k)) malformed(name(), "size");
    for (uint32_t j = 0; j < k; ++j) {
      const uint32_t i = get<uint32_t>(p, at, name());
      if (int64_t(i) >= n) malformed(name(), "index out of range");
      acc[i] += get<float>(p, at, name());
    }
  }
  int64_t encoded_bytes(int64_t n) const override { return 4 + 8 * kept_count(n, keep_); }
  std::string name() const override { return "topk"; }
  double error_bound() const override { return std::numeric_limits<double>::infinity(); }

 private:
  double keep_;
};

}  // namespace

std::string Codec::encode_from(int64_t n, const Fill& fill, Rng& rng) const {
  std::vector<float> x(static_cast<size_t>(n));
  parallel_for(n, kChunkValues, [&](int64_t b, int64_t e) { fill(b, e - b, x.data() + b); });
  return encode(x.data(), n, rng);
}

void Codec::decode_add_range(const std::string&, int64_t, int64_t, int64_t, float*) const {
  fail("internal: codec " + name() + " decodes whole payloads only");
}

void Codec::check_payload(const std::string& payload, int64_t n) const {
  if (int64_t(payload.size()) != encoded_bytes(n)) malformed(name(), "size");
}

std::unique_ptr<Codec> make_codec(const CodecConfig& c) {
  check(c.rounding == "nearest" || c.rounding == "stochastic",
        "outer.rounding must be \"nearest\" or \"stochastic\", got \"" + c.rounding + "\"");
  check(c.block >= 1, "outer.block must be >= 1");
  check(c.keep_fraction > 0 && c.keep_fraction <= 1, "outer.keep_fraction must be in (0, 1]");
  const bool sr = c.rounding == "stochastic";
  if (c.format == "fp32") return std::make_unique<Fp32>();
  if (c.format == "bf16") return std::make_unique<Bf16>(sr);
  if (c.format == "fp8") return std::make_unique<GridCodec>("fp8", e4m3_grid(), 8, c.block, sr);
  if (c.format == "fp4-e3m0") return std::make_unique<GridCodec>("fp4-e3m0", e3m0_grid(), 4, c.block, sr);
  if (c.format == "fp4-e2m1")
    return std::make_unique<GridCodec>("fp4-e2m1", std::vector<float>{0, 0.5f, 1, 1.5f, 2, 3, 4, 6}, 4, c.block, sr);
  if (c.format == "int8") return std::make_unique<Int8>(c.block, sr);
  if (c.format == "random-drop") return std::make_unique<RandomDrop>(c.keep_fraction);
  if (c.format == "topk") return std::make_unique<TopK>(c.keep_fraction);
  fail("unknown outer.codec \"" + c.format + "\" (fp32, bf16, fp8, fp4-e3m0, fp4-e2m1, int8, random-drop, topk)");
}

EncodedReduce choose_encoded_reduce(const std::string& setting, int workers) {
  if (setting == "all-gather") return EncodedReduce::AllGather;
  if (setting == "reduce-scatter") return EncodedReduce::ReduceScatter;
  check(setting == "auto", "outer.reduce must be auto, all-gather or reduce-scatter, got " + setting);
  return workers <= 2 ? EncodedReduce::AllGather : EncodedReduce::ReduceScatter;
}

int64_t shard_begin(int64_t n, int M, int k) { return n * k / M; }

int64_t encoded_sync_bytes(const Codec& codec, EncodedReduce how, int64_t n, int M, int index) {
  if (M <= 1) return 0;
  if (how == EncodedReduce::AllGather) return int64_t(M - 1) * codec.encoded_bytes(n);
  int64_t bytes = 0;
  for (int k = 0; k < M; ++k) {
    const int64_t shard = codec.encoded_bytes(shard_begin(n, M, k + 1) - shard_begin(n, M, k));
    bytes += k == index ? int64_t(M - 1) * shard : shard;
  }
  return bytes;
}

}  // namespace loco
