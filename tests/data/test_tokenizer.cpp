#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/prepare.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "core/fs.h"

using namespace loco;

namespace {
std::string tmpdir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/" + name;
  std::filesystem::remove_all(d);
  make_dirs(d);
  return d;
}

void write_text(const std::string& path, int lines, int seed) {
  std::ofstream f(path);
  const char* words[] = {"alpha", "beta", "gamma", "delta", "über", "naïve", "café", "x", "yz", "!"};
  uint32_t s = uint32_t(seed);
  for (int l = 0; l < lines; ++l) {
    for (int w = 0; w < 8; ++w) {
      s = s * 1664525u + 1013904223u;
      f << words[(s >> 16) % 10] << (w < 7 ? " " : "\n");
    }
  }
}
}  // namespace

TEST(Tokenizer, BytesRoundTrip) {
  const auto t = make_byte_tokenizer();
  const std::string s = "héllo, wörld\n\t\x01";
  const auto ids = t->encode(s);
  EXPECT_EQ(ids.size(), s.size());
  EXPECT_EQ(t->decode(ids), s);
}

TEST(Tokenizer, SentencePiecePrepareAndRoundTrip) {
  const auto dir = tmpdir("spm");
  make_dirs(dir + "/in/sub");
  write_text(dir + "/in/a.txt", 400, 1);
  write_text(dir + "/in/sub/b.txt", 400, 2);
  PrepareOptions o;
  o.inputs = {dir + "/in"};
  o.vocab_size = 320;
  o.val_fraction = 0.2;
  o.block_lines = 16;
  o.out_dir = dir + "/out";
  const auto sum = prepare_data(o);
  EXPECT_EQ(sum.files, 2);
  EXPECT_EQ(sum.lines, 800);
  EXPECT_EQ(sum.vocab_size, 320);
  EXPECT_GT(sum.val_tokens, 0);
  EXPECT_GT(sum.train_tokens, 3 * sum.val_tokens);
  const auto tok = load_tokenizer(o.out_dir);
  const std::string text = "gamma café naïve delta !";
  EXPECT_EQ(tok->decode(tok->encode(text)), text);
  // Unseen characters survive through byte fallback.
  EXPECT_EQ(tok->decode(tok->encode("Zürich ∑")), "Zürich ∑");
  // The token files hold exactly the counted tokens, all within the vocabulary.
  const auto train = read_token_file(o.out_dir + "/train.tok");
  EXPECT_EQ(int64_t(train.tokens.size()), sum.train_tokens);
  EXPECT_EQ(train.vocab_size, 320u);
  // Same inputs and seed: identical output.
  o.out_dir = dir + "/out2";
  prepare_data(o);
  EXPECT_EQ(read_file(dir + "/out/train.tok"), read_file(dir + "/out2/train.tok"));
  const auto tok2 = load_tokenizer(o.out_dir);
  EXPECT_EQ(tok2->encode("alpha beta gamma über x yz"), tok->encode("alpha beta gamma über x yz"));
}

TEST(Tokenizer, BytesPrepareKeepsEveryByte) {
  const auto dir = tmpdir("bytes");
  write_text(dir + "/a.txt", 100, 3);
  PrepareOptions o;
  o.inputs = {dir + "/a.txt"};
  o.tokenizer = "bytes";
  o.val_fraction = 0.0;
  o.out_dir = dir + "/out";
  const auto sum = prepare_data(o);
  const auto train = read_token_file(o.out_dir + "/train.tok");
  std::string back;
  for (int32_t id : train.tokens) back.push_back(char(id));
  EXPECT_EQ(back, read_file(dir + "/a.txt"));
  EXPECT_EQ(sum.val_tokens, 0);
}

TEST(Tokenizer, InvalidUtf8NamesFileAndOffset) {
  const auto dir = tmpdir("utf8");
  {
    std::ofstream f(dir + "/bad.txt", std::ios::binary);
    f << "fine line\nsecond \xC3\x28 oops\n";  // 0xC3 followed by a non-continuation byte
  }
  PrepareOptions o;
  o.inputs = {dir + "/bad.txt"};
  o.tokenizer = "bytes";
  o.out_dir = dir + "/out";
  try {
    prepare_data(o);
    FAIL() << "accepted invalid UTF-8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.txt: invalid UTF-8 at byte offset 17"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, Utf8Validator) {
  std::string carry;
  EXPECT_FALSE(find_invalid_utf8("abc", 3, carry));
  const std::string euro = "\xE2\x82\xAC";  // split across two chunks
  EXPECT_FALSE(find_invalid_utf8(euro.data(), 2, carry));
  EXPECT_EQ(carry.size(), 2u);
  EXPECT_FALSE(find_invalid_utf8(euro.data() + 2, 1, carry));
  EXPECT_TRUE(carry.empty());
  for (const std::string bad : {"\xC0\x80", "\xED\xA0\x80", "\xF5\x80\x80\x80", "\x80", "\xFF"}) {
    carry.clear();
    const auto at = find_invalid_utf8(bad.data(), bad.size(), carry);
    ASSERT_TRUE(at.has_value()) << "accepted an invalid sequence";
    EXPECT_EQ(*at, 0);
  }
}

TEST(TokenFileWriter, StreamsAndPatchesHeader) {
  const auto dir = tmpdir("writer");
  const std::string p = dir + "/s.tok";
  {
    TokenFileWriter w(p, 70000);
    for (int i = 0; i < 5000; ++i) {
      const int32_t id = i * 13 % 70000;
      w.append(&id, 1);
    }
    EXPECT_FALSE(file_exists(p)) << "file visible before finish()";
    w.finish();
  }
  const auto tf = read_token_file(p);
  ASSERT_EQ(tf.tokens.size(), 5000u);
  EXPECT_EQ(tf.tokens[4999], 4999 * 13 % 70000);
  {
    TokenFileWriter abandoned(dir + "/gone.tok", 10);
    const int32_t id = 3;
    abandoned.append(&id, 1);
  }
  EXPECT_FALSE(file_exists(dir + "/gone.tok"));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1) << "temporary file left behind";
}
