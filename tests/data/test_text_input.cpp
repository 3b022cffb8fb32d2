// Text inputs of `loco data prepare`: text and JSON Lines, plain or gzip, the same documents and
// lines either way, and a one-line error naming the file and line for each kind of bad input.
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/text_input.h"

using namespace loco;

namespace {

struct Line {
  int64_t doc;
  std::string text;
  bool operator==(const Line&) const = default;
};

std::string temp_dir() {
  const auto d = std::filesystem::temp_directory_path() /
                 ("loco_text_input_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::create_directories(d);
  return d.string();
}

void write_plain(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary) << data;
}

void write_gzip(const std::string& path, const std::string& data) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, data.data(), unsigned(data.size())), int(data.size()));
  gzclose(f);
}

std::vector<Line> read_all(const std::vector<std::string>& files, const TextInputOptions& o = {},
                           int64_t* bytes = nullptr) {
  std::vector<Line> out;
  int64_t expect_index = 0;
  const int64_t b = for_each_input_line(files, o, true, [&](int64_t doc, std::string& line, int64_t index) {
    EXPECT_EQ(index, expect_index++);
    out.push_back({doc, line});
  });
  if (bytes) *bytes = b;
  return out;
}

std::string error_of(const std::vector<std::string>& files, const TextInputOptions& o = {}) {
  try {
    read_all(files, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(TextInput, JsonlRecordsAreDocumentsAndGzipIsTransparent) {
  const std::string d = temp_dir();
  const std::string text = "first line\nsecond line caf\xc3\xa9\n";
  const std::string jsonl = "{\"id\": 1, \"text\": \"a\\nb\"}\n\n{\"text\": \"c\\u00e9\"}\n{\"text\": \"\"}\n{\"text\": \"d\\n\"}";
  write_plain(d + "/t.txt", text);
  write_gzip(d + "/t.txt.gz", text);
  write_plain(d + "/r.jsonl", jsonl);
  write_gzip(d + "/r.jsonl.gz", jsonl);
  // Two gzip members back to back read as one stream (as `cat a.gz b.gz` makes).
  write_gzip(d + "/m1.gz", "one\ntw");
  write_gzip(d + "/m2.gz", "o\n");
  {
    std::ofstream out(d + "/multi.txt.gz", std::ios::binary);
    for (const char* p : {"/m1.gz", "/m2.gz"}) out << std::ifstream(d + p, std::ios::binary).rdbuf();
  }

  const std::vector<Line> expect_text = {{0, "first line"}, {0, "second line caf\xc3\xa9"}};
  EXPECT_EQ(read_all({d + "/t.txt"}), expect_text);
  EXPECT_EQ(read_all({d + "/t.txt.gz"}), expect_text);
  const std::vector<Line> expect_jsonl = {{0, "a"}, {0, "b"}, {1, "c\xc3\xa9"}, {3, "d"}};
  int64_t bytes = 0;
  EXPECT_EQ(read_all({d + "/r.jsonl"}, {}, &bytes), expect_jsonl);
  EXPECT_EQ(bytes, 3 + 3 + 0 + 2);  // the documents' text
  EXPECT_EQ(read_all({d + "/r.jsonl.gz"}), expect_jsonl);
  EXPECT_EQ(read_all({d + "/multi.txt.gz"}), (std::vector<Line>{{0, "one"}, {0, "two"}}));
  // Documents are numbered across files; a forced format overrides the names.
  const auto both = read_all({d + "/t.txt", d + "/r.jsonl"});
  ASSERT_EQ(both.size(), 6u);
  EXPECT_EQ(both[2], (Line{1, "a"}));
  EXPECT_EQ(both[5], (Line{4, "d"}));
  TextInputOptions as_text;
  as_text.format = "text";
  EXPECT_EQ(read_all({d + "/r.jsonl"}, as_text).size(), 5u);  // the raw lines, blank one included
  TextInputOptions other_field;
  other_field.format = "jsonl";
  other_field.jsonl_field = "body";
  write_plain(d + "/body.json", "{\"body\": \"x\"}\n");
  EXPECT_EQ(read_all({d + "/body.json"}, other_field), (std::vector<Line>{{0, "x"}}));
}

TEST(TextInput, BadInputsNameTheFileAndLine) {
  const std::string d = temp_dir();
  auto bad = [&](const std::string& name, const std::string& data, bool gz = false) {
    const std::string p = d + "/" + name;
    if (gz)
      write_gzip(p, data);
    else
      write_plain(p, data);
    return error_of({p});
  };
  const std::string ok = "{\"text\": \"fine\"}\n";
  EXPECT_EQ(bad("a.jsonl", ok + "not json\n"),
            d + "/a.jsonl:2: not valid JSON (parse error at column 2: syntax error while parsing value - invalid literal)");
  EXPECT_EQ(bad("b.jsonl", ok + ok + "[1, 2]\n"), d + "/b.jsonl:3: not a JSON object");
  EXPECT_EQ(bad("c.jsonl", "{\"txt\": \"x\"}\n"), d + "/c.jsonl:1: no field \"text\" (set the field with --jsonl-field)");
  EXPECT_EQ(bad("d.jsonl", "{\"text\": 5}\n"), d + "/d.jsonl:1: field \"text\" is not a string");
  // Invalid UTF-8 inside a JSON string, and a lone surrogate escape, are JSON errors.
  EXPECT_NE(bad("e.jsonl", ok + "{\"text\": \"\xff\"}\n").find("e.jsonl:2: not valid JSON"), std::string::npos);
  EXPECT_NE(bad("f.jsonl", "{\"text\": \"\\ud800\"}\n").find("f.jsonl:1: not valid JSON"), std::string::npos);
  EXPECT_NE(bad("g.jsonl.gz", ok + "{\"text\": 1}\n", true).find("g.jsonl.gz:2: field \"text\" is not a string"),
            std::string::npos);
  // Text: the byte offset of the first invalid UTF-8, in the decompressed text for gzip.
  EXPECT_EQ(bad("h.txt", "ok\n\xc3\x28\n"), d + "/h.txt: invalid UTF-8 at byte offset 3");
  EXPECT_EQ(bad("i.txt.gz", "ok\n\xc3\x28\n", true), d + "/i.txt.gz: invalid UTF-8 at byte offset 3 of the decompressed text");
  // A sequence cut by the end of the file.
  EXPECT_EQ(bad("j.txt", "ok\n\xe2\x82"), d + "/j.txt: invalid UTF-8 at byte offset 3");

  // Truncated and corrupted gzip streams.
  std::string big;
  for (int i = 0; i < 2000; ++i) big += "{\"text\": \"line " + std::to_string(i * 7919 % 10007) + "\"}\n";
  write_gzip(d + "/full.jsonl.gz", big);
  std::ifstream in(d + "/full.jsonl.gz", std::ios::binary);
  const std::string gz((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(gz.size(), 200u);
  write_plain(d + "/trunc.jsonl.gz", gz.substr(0, gz.size() / 2));
  EXPECT_EQ(error_of({d + "/trunc.jsonl.gz"}), d + "/trunc.jsonl.gz: corrupt or truncated gzip data: unexpected end of file");
  std::string corrupt = gz;
  for (size_t i = 30; i < 60; ++i) corrupt[i] = char(0xff);
  write_plain(d + "/corrupt.jsonl.gz", corrupt);
  EXPECT_NE(error_of({d + "/corrupt.jsonl.gz"}).find("corrupt.jsonl.gz: corrupt or truncated gzip data: "),
            std::string::npos);
  // Bad options.
  TextInputOptions o;
  o.format = "csv";
  EXPECT_NE(error_of({d + "/h.txt"}, o).find("--input-format must be auto, text or jsonl"), std::string::npos);
  std::filesystem::remove_all(d);
}
