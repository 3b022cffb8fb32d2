#include <gtest/gtest.h>

#include "../tolerance.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "comm/codec.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"

using namespace loco;

namespace {

std::unique_ptr<Codec> codec(const std::string& fmt, const std::string& rounding = "nearest", int block = 128,
                             double keep = 0.1) {
  return make_codec({fmt, rounding, block, keep});
}

std::vector<float> decode(const Codec& c, const std::string& p, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n), 0.0f);
  c.decode_add(p, out.data(), n);
  return out;
}

std::vector<float> randn(int64_t n, uint64_t seed, double scale = 1e-3) {
  Rng r(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = float(scale * r.normal());
  return v;
}

const char* kAll[] = {"fp32", "bf16", "fp8", "fp4-e3m0", "fp4-e2m1", "int8", "random-drop", "topk"};

}  // namespace

TEST(Codec, EncodedSizeIsExact) {
  Rng rng(1);
  for (const char* f : kAll)
    for (int64_t n : {1, 31, 128, 1000, 4097}) {
      auto c = codec(f);
      const auto x = randn(n, uint64_t(n));
      EXPECT_EQ(int64_t(c->encode(x.data(), n, rng).size()), c->encoded_bytes(n)) << f << " n=" << n;
    }
  // Formulas (bits per value, block 128): fp4 = 4 + 8/128, fp8 = 8 + 8/128, int8 = 8 + 32/128.
  EXPECT_EQ(codec("fp4-e3m0")->encoded_bytes(1024), 1024 / 2 + 8);
  EXPECT_EQ(codec("fp4-e2m1")->encoded_bytes(1000), 7 * (1 + 64) + (1 + 52));
  EXPECT_EQ(codec("fp8")->encoded_bytes(1024), 1024 + 8);
  EXPECT_EQ(codec("int8")->encoded_bytes(1024), 1024 + 4 * 8);
  EXPECT_EQ(codec("bf16")->encoded_bytes(1000), 2000);
  EXPECT_EQ(codec("fp4-e3m0", "nearest", 32)->encoded_bytes(1024), 1024 / 2 + 32);  // MX blocks of 32
  EXPECT_EQ(codec("topk", "nearest", 128, 0.01)->encoded_bytes(1000), 4 + 8 * 10);
  EXPECT_EQ(codec("random-drop", "nearest", 128, 0.25)->encoded_bytes(1000), 8 + 4 * 250);
}

TEST(Codec, RepresentableValuesRoundTripExactly) {
  Rng rng(2);
  const float s = std::ldexp(1.0f, -9);  // any power-of-two scale
  const std::vector<std::pair<std::string, std::vector<float>>> cases = {
      {"fp32", {0.1f, -3e-7f, 12345.678f, 0.0f}},
      {"bf16", {1.0f, -0.15625f, std::ldexp(1.0f, -20), 0.0f}},
      {"fp8", {448 * s, -0.0625f * s, 1.125f * s, std::ldexp(3.0f, -9) * s, 0.0f}},
      {"fp4-e3m0", {1 * s, -0.5f * s, 0.25f * s, -s / 64, 0.0f, s / 8}},
      {"fp4-e2m1", {6 * s, -3 * s, 1.5f * s, 0.5f * s, 0.0f, -4 * s}},
      {"int8", {127 * 0.25f, -3 * 0.25f, 0.0f, 64 * 0.25f}},
  };
  for (const auto& [fmt, vals] : cases) {
    for (const char* rounding : {"nearest", "stochastic"}) {
      auto c = codec(fmt, rounding);
      const auto out = decode(*c, c->encode(vals.data(), int64_t(vals.size()), rng), int64_t(vals.size()));
      for (size_t i = 0; i < vals.size(); ++i) EXPECT_EQ(out[i], vals[i]) << fmt << " " << rounding << " [" << i << "]";
    }
  }
}

TEST(Codec, ErrorBoundsOnRandomData) {
  // |decoded - x| <= error_bound() x (block max |x|); bf16 is relative to |x| itself. The
  // bounds follow from the formats: the widest grid gap over the top value.
  const std::vector<std::pair<std::string, double>> bounds = {
      {"fp8", 32.0 / 448}, {"fp4-e2m1", 1.0 / 3}, {"fp4-e3m0", 0.5}, {"int8", 1.0 / 254}};
  Rng rng(3);
  const int64_t n = 4096, block = 128;
  const auto x = randn(n, 4);
  for (const auto& [fmt, documented] : bounds) {
    auto c = codec(fmt);
    LOCO_EXPECT_NEAR(c->error_bound(), documented, 1e-12) << fmt;
    const double bound = c->error_bound() + 1e-7;
    const auto out = decode(*c, c->encode(x.data(), n, rng), n);
    double sq = 0, sq_x = 0;
    for (int64_t b0 = 0; b0 < n; b0 += block) {
      float maxabs = 0;
      for (int64_t i = b0; i < b0 + block; ++i) maxabs = std::max(maxabs, std::abs(x[size_t(i)]));
      for (int64_t i = b0; i < b0 + block; ++i) {
        LOCO_EXPECT_AT_MOST(std::abs(out[size_t(i)] - x[size_t(i)]), bound * maxabs * (1 + 1e-6)) << fmt << " [" << i << "]";
        sq += std::pow(out[size_t(i)] - x[size_t(i)], 2);
        sq_x += std::pow(x[size_t(i)], 2);
      }
    }
    std::printf("%-9s relative RMS error %.4f\n", fmt.c_str(), std::sqrt(sq / sq_x));
  }
  auto c = codec("bf16");
  const auto out = decode(*c, c->encode(x.data(), n, rng), n);
  for (int64_t i = 0; i < n; ++i)
    EXPECT_LE(std::abs(out[size_t(i)] - x[size_t(i)]), std::abs(x[size_t(i)]) * std::ldexp(1.0, -8));
}

TEST(Codec, StochasticRoundingIsUnbiased) {
  // Values between grid points: the mean of many stochastic encodings converges to them.
  const std::vector<float> x = {0.3f, -0.77f, 0.011f, 0.49f, -0.051f, 1.0f, 0.0f, 0.1234f};
  const int64_t n = int64_t(x.size());
  for (const char* fmt : {"bf16", "fp8", "fp4-e3m0", "fp4-e2m1", "int8", "random-drop"}) {
    auto c = codec(fmt, "stochastic", 128, 0.5);
    Rng rng(5);
    const int draws = 20000;
    std::vector<double> mean(x.size(), 0.0);
    for (int d = 0; d < draws; ++d) {
      const auto out = decode(*c, c->encode(x.data(), n, rng), n);
      for (size_t i = 0; i < x.size(); ++i) mean[i] += out[i] / draws;
    }
    for (size_t i = 0; i < x.size(); ++i)
      LOCO_EXPECT_NEAR(mean[i], x[i], 0.01) << fmt << " value " << x[i];  // ~4 standard errors at the worst spacing
  }
  // Round-to-nearest is biased on the same values (the test above could not pass by accident).
  auto nearest = codec("fp4-e3m0");
  Rng rng(6);
  const auto out = decode(*nearest, nearest->encode(x.data(), n, rng), n);
  EXPECT_GT(std::abs(out[0] - x[0]), 0.02);
}

TEST(Codec, NonFiniteInputIsRejected) {
  Rng rng(7);
  for (const char* f : kAll) {
    auto c = codec(f);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      const std::vector<float> x = {1.0f, bad, 2.0f};
      EXPECT_THROW(c->encode(x.data(), 3, rng), Error) << f;
    }
  }
}

// Encoding and decoding split the values over loco's compute threads where no random numbers are
// drawn: the payload and the decoded sums must not depend on the thread count (members with other
// thread counts exchange payloads; runs must be repeatable on other machines).
TEST(Codec, ThreadCountLeavesPayloadsAndSumsUnchanged) {
  const int64_t n = 3 * (int64_t(1) << 18) + 77;  // several chunks; the last block ragged
  const auto x = randn(n, 11);
  struct Run {
    std::string bytes;
    std::vector<float> sum;
  };
  auto run = [&](const Codec& c, int threads) {
    set_compute_threads(threads);
    Rng rng(12);
    Run r;
    r.bytes = c.encode(x.data(), n, rng);
    r.sum.assign(size_t(n), 0.25f);
    c.decode_add(r.bytes, r.sum.data(), n);
    return r;
  };
  for (const char* f : kAll)
    for (const char* rounding : {"nearest", "stochastic"})
      for (int block : {128, 99}) {  // 99: odd blocks, whose last 4-bit code has a byte of its own
        const auto c = codec(f, rounding, block);
        const Run one = run(*c, 1), four = run(*c, 4);
        EXPECT_EQ(one.bytes, four.bytes) << f << " " << rounding << " block " << block;
        EXPECT_EQ(0, std::memcmp(one.sum.data(), four.sum.data(), size_t(n) * sizeof(float)))
            << f << " " << rounding << " block " << block;
      }
  // A non-finite value is named by its first index whatever the threads; a malformed payload is
  // refused from any chunk.
  auto bad = x;
  bad[size_t(n - 5)] = std::numeric_limits<float>::infinity();
  bad[size_t(n - 100)] = std::numeric_limits<float>::quiet_NaN();
  Rng rng(13);
  try {
    codec("fp4-e3m0")->encode(bad.data(), n, rng);
    ADD_FAILURE() << "a non-finite value was encoded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at index " + std::to_string(n - 100)), std::string::npos) << e.what();
  }
  const auto fp8 = codec("fp8");
  std::string payload = fp8->encode(x.data(), n, rng);
  payload[payload.size() - 3] = char(0x7F);  // a NaN code in the last block
  std::vector<float> acc(size_t(n), 0.0f);
  EXPECT_THROW(fp8->decode_add(payload, acc.data(), n), Error);
  set_compute_threads(int(std::max(1u, std::thread::hardware_concurrency())));
}

// encode_from (the values made piece by piece, as Streaming DiLoCo makes an outer gradient from
// the parameters) gives encode()'s bytes, with any thread count, and names the same first
// non-finite value; decode_add_range adds to a range what decode_add adds there, to the bit.
TEST(Codec, PiecesGiveTheWholeArraysBytesAndSums) {
  const int64_t n = 2 * (int64_t(1) << 18) + 4096 * 3 + 77;  // chunks and pieces; the last block ragged
  const auto x = randn(n, 21);
  const Codec::Fill fill = [&](int64_t b, int64_t len, float* out) {
    ASSERT_TRUE(b >= 0 && len > 0 && b + len <= n);
    std::memcpy(out, x.data() + b, size_t(len) * sizeof(float));
  };
  for (int threads : {1, 3})
    for (const char* f : kAll)
      for (const char* rounding : {"nearest", "stochastic"})
        for (int block : {128, 99, 5000}) {  // 5000: blocks larger than a piece
          set_compute_threads(threads);
          const auto c = codec(f, rounding, block);
          Rng r1(5), r2(5);
          const std::string whole = c->encode(x.data(), n, r1), pieces = c->encode_from(n, fill, r2);
          EXPECT_EQ(whole, pieces) << f << " " << rounding << " block " << block << " threads " << threads;
          const int64_t align = c->range_alignment();
          if (align == 0) continue;
          const auto sum = decode(*c, whole, n);
          std::vector<float> by_range(size_t(n), 0.0f);
          for (int64_t b = 0; b < n; b += 7 * align) {  // ranges of 7 blocks, the last one short
            const int64_t len = std::min(7 * align, n - b);
            c->decode_add_range(whole, n, b, len, by_range.data() + b);
          }
          EXPECT_EQ(0, std::memcmp(sum.data(), by_range.data(), size_t(n) * sizeof(float)))
              << f << " " << rounding << " block " << block;
          EXPECT_THROW(c->decode_add_range(whole, n, align / 2 + 1, align, by_range.data()), Error) << f;
        }
  auto bad = x;
  bad[size_t(n - 5)] = std::numeric_limits<float>::infinity();
  bad[size_t(n / 2)] = std::numeric_limits<float>::quiet_NaN();
  for (const char* f : kAll) {
    Rng rng(3);
    try {
      codec(f)->encode_from(n, [&](int64_t b, int64_t len, float* out) {
        std::memcpy(out, bad.data() + b, size_t(len) * sizeof(float));
      }, rng);
      ADD_FAILURE() << f << ": a non-finite value was encoded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("at index " + std::to_string(n / 2) + ";"), std::string::npos) << e.what();
    }
  }
  set_compute_threads(int(std::max(1u, std::thread::hardware_concurrency())));
}

// A peer's payload whose scales no encoder writes (a shared exponent byte of 255, which would
// scale by 2^128; an int8 block scale that is negative, infinite or NaN) is refused by decode_add
// and by check_payload (what loco.torch runs before decoding on a GPU), in any block.
TEST(Codec, ScalesNoEncoderWritesAreRefused) {
  const int64_t n = 1000;
  const auto x = randn(n, 14);
  std::vector<float> acc(static_cast<size_t>(n), 0.0f);
  for (const char* f : {"fp8", "fp4-e3m0", "fp4-e2m1", "int8"}) {
    auto c = codec(f);
    Rng rng(15);
    const std::string good = c->encode(x.data(), n, rng);
    EXPECT_NO_THROW(c->check_payload(good, n)) << f;
    const bool int8 = std::string(f) == "int8";
    const size_t last_block = size_t(c->encoded_bytes(7 * 128));  // block 7 of 8 (n = 1000: 7 whole, 1 short)
    std::vector<std::string> bad;
    if (int8) {
      for (float s : {-1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
        std::string p = good;
        std::memcpy(p.data() + last_block, &s, 4);
        bad.push_back(p);
      }
    } else {
      std::string p = good;
      p[last_block] = char(255);
      bad.push_back(p);
    }
    for (const auto& p : bad) {
      EXPECT_THROW(c->check_payload(p, n), Error) << f;
      EXPECT_THROW(c->decode_add(p, acc.data(), n), Error) << f;
    }
  }
}

TEST(Codec, TopKKeepsTheLargestAndDecodeChecksPayloads) {
  Rng rng(8);
  const std::vector<float> x = {0.1f, -5.0f, 0.2f, 3.0f, -0.3f, 0.0f, 4.0f, 0.05f, 0.0f, 0.01f};
  auto c = codec("topk", "nearest", 128, 0.3);
  const auto out = decode(*c, c->encode(x.data(), 10, rng), 10);
  EXPECT_EQ(out, (std::vector<float>{0, -5.0f, 0, 3.0f, 0, 0, 4.0f, 0, 0, 0}));
  for (const char* f : kAll) {
    auto k = codec(f);
    std::vector<float> acc(10, 0.0f);
    EXPECT_THROW(k->decode_add(std::string(3, 'x'), acc.data(), 10), Error) << f;
  }
  EXPECT_THROW(codec("fp5"), Error);
  EXPECT_THROW(codec("fp8", "sometimes"), Error);
}

// fp4's and fp8's nearest rounding (fp4 counted against midpoints, fp8 by E4M3's bits, in
// vectorized loops: comm/codec.cpp) gives each value the code of the nearer grid value, a tie
// going to the even code, as a reference computed here in double (where a value's distances to
// its two grid neighbours are exact): at every grid value, midpoint and their neighbouring
// floats, with both signs and zeros of both signs, over scales from subnormal to large, in blocks
// of 128 and 99 and a ragged last one.
TEST(Codec, NearestRoundingMatchesAReferenceAtEveryTieAndEdge) {
  std::vector<float> e4m3;  // by code: E4M3's magnitudes, 0x7F (NaN) left out
  for (int c = 0; c < 127; ++c)
    e4m3.push_back(c < 8 ? std::ldexp(float(c), -9) : std::ldexp(1.0f + float(c & 7) / 8, (c >> 3) - 7));
  const std::vector<std::pair<std::string, std::vector<float>>> grids = {
      {"fp4-e3m0", {0, 1.0f / 64, 1.0f / 32, 1.0f / 16, 1.0f / 8, 0.25f, 0.5f, 1}},
      {"fp4-e2m1", {0, 0.5f, 1, 1.5f, 2, 3, 4, 6}},
      {"fp8", e4m3}};
  for (const auto& [fmt, g] : grids) {
    const bool byte_codes = g.size() > 8;
    const int sign = byte_codes ? 0x80 : 0x08;
    // The interesting magnitudes on the grid's own scale (0 to its top), and a little past it.
    std::vector<float> unit;
    for (size_t k = 0; k < g.size(); ++k) {
      std::vector<float> at = {g[k]};
      if (k + 1 < g.size()) at.push_back((g[k] + g[k + 1]) / 2);
      for (float a : at)
        for (float b : {a, std::nextafter(a, 0.0f), std::nextafter(a, 100.0f)}) unit.push_back(b);
    }
    unit.push_back(g.back() * 1.0000001f);
    Rng rng(21);
    std::vector<float> x;
    for (int e : {-149, -140, -130, -127, -126, -100, -20, -1, 0, 3, 60, 120}) {
      // A block whose largest magnitude is the grid's top at scale 2^e (so the scale is 2^e when
      // representable), holding every interesting magnitude with both signs, then random ones.
      const float top = std::ldexp(g.back(), e);
      if (!std::isfinite(top)) continue;
      x.push_back(top);
      for (float u : unit)
        for (float sign : {1.0f, -1.0f}) x.push_back(sign * std::ldexp(u, e) * (u <= g.back() ? 1.0f : 0.0f));
      x.push_back(-0.0f);
      for (int i = 0; i < 150; ++i) x.push_back(float(std::ldexp(rng.normal(), e)));
    }
    for (int i = 0; i < 128; ++i) x.push_back(i % 2 ? -0.0f : 0.0f);  // blocks of zeros
    for (int block : {128, 99}) {
      const int64_t n = int64_t(x.size());
      std::string want;
      for (int64_t b0 = 0; b0 < n; b0 += block) {
        const int64_t len = std::min<int64_t>(block, n - b0);
        float maxabs = 0;
        for (int64_t i = 0; i < len; ++i) maxabs = std::max(maxabs, std::abs(x[size_t(b0 + i)]));
        int s = -127;  // the smallest s with 2^s >= maxabs / top, within E8M0's range
        const float t = maxabs / g.back();
        if (t > 0)
          while (s < 127 && std::ldexp(1.0, s) < double(t)) ++s;
        want.push_back(char(uint8_t(s + 127)));
        std::vector<uint8_t> codes(static_cast<size_t>(len));
        for (int64_t i = 0; i < len; ++i) {
          const float v = x[size_t(b0 + i)];
          const double y = double(std::abs(v) * std::ldexp(1.0f, -s));  // the encoder's float product
          int c = int(g.size()) - 1;
          if (y < double(g.back())) {
            int lo = 0;
            while (double(g[size_t(lo) + 1]) <= y) ++lo;
            const double below = y - double(g[size_t(lo)]), above = double(g[size_t(lo) + 1]) - y;
            c = below < above ? lo : below > above ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1);
          }
          codes[size_t(i)] = uint8_t(c | (std::signbit(v) ? sign : 0));
        }
        for (int64_t i = 0; i < len; i += byte_codes ? 1 : 2)
          want.push_back(char(byte_codes ? codes[size_t(i)]
                                         : uint8_t(codes[size_t(i)] | (i + 1 < len ? codes[size_t(i) + 1] << 4 : 0))));
      }
      Rng unused(1);
      const std::string got = codec(fmt, "nearest", block)->encode(x.data(), n, unused);
      ASSERT_EQ(got.size(), want.size()) << fmt << " block " << block;
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(uint8_t(got[i]), uint8_t(want[i])) << fmt << " block " << block << ": byte " << i;
    }
  }
}
