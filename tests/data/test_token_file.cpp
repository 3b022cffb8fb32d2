#include <gtest/gtest.h>

#include "core/error.h"
#include "../error_of.h"
#include "data/token_file.h"
#include "core/fs.h"

using namespace loco;

namespace {
std::string tmp(const std::string& name) { return ::testing::TempDir() + "/" + name; }

std::string error_reading(const std::string& bytes) {
  const auto p = tmp("bad.tok");
  write_file_atomic(p, bytes);
  return test::error_of([&] { read_token_file(p); });
}
}  // namespace

TEST(TokenFile, RoundTripBothWidths) {
  for (uint64_t vocab : {300ull, 65536ull, 70000ull}) {
    std::vector<int32_t> toks;
    for (int i = 0; i < 1000; ++i) toks.push_back(int32_t((uint64_t(i) * 7919) % vocab));
    const auto p = tmp("rt.tok");
    write_token_file(p, toks, vocab);
    const auto tf = read_token_file(p);
    EXPECT_EQ(tf.vocab_size, vocab);
    EXPECT_EQ(tf.tokens, toks);
    EXPECT_EQ(read_file(p).size(), 64 + toks.size() * (vocab <= 65536 ? 2 : 4));
  }
}

TEST(TokenFile, HeaderLayout) {
  const std::string b = encode_token_file({1, 2, 3}, 10);
  EXPECT_EQ(b.substr(0, 8), "LOCOTOKS");
  EXPECT_EQ(b[8], 1);   // version
  EXPECT_EQ(b[12], 2);  // bytes per token
  EXPECT_EQ(b[16], 10);
  EXPECT_EQ(b[24], 3);
  for (size_t i = 32; i < 64; ++i) EXPECT_EQ(b[i], 0);
  EXPECT_EQ(b[64], 1);
  EXPECT_EQ(b[66], 2);
}

TEST(TokenFile, RejectsCorruptFiles) {
  const std::string good = encode_token_file({1, 2, 3, 4}, 10);
  EXPECT_NE(error_reading(good.substr(0, 70)).find("truncated or corrupt"), std::string::npos);
  EXPECT_NE(error_reading(good + "x").find("truncated or corrupt"), std::string::npos);
  EXPECT_NE(error_reading(good.substr(0, 40)).find("shorter than the 64-byte header"), std::string::npos);
  std::string magic = good;
  magic[0] = 'X';
  EXPECT_NE(error_reading(magic).find("bad magic"), std::string::npos);
  std::string version = good;
  version[8] = 2;
  EXPECT_NE(error_reading(version).find("unsupported LOCOTOKS version 2"), std::string::npos);
  std::string width = good;
  width[12] = 3;
  EXPECT_NE(error_reading(width).find("bytes per token must be 2 or 4"), std::string::npos);
  std::string big = good;
  big[64 + 2 * 2] = 10;  // third token := 10 == vocab
  EXPECT_NE(error_reading(big).find("token 2 has id 10 >= vocabulary size 10"), std::string::npos);
  EXPECT_THROW(encode_token_file({1, 10}, 10), Error);
}
