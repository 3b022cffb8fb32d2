#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "../error_of.h"
#include "core/json.h"
#include "core/fs.h"
#include "io/safetensors.h"
#include "io/train_state.h"

using namespace loco;

using loco::test::error_of;

namespace {

std::string tmp(const std::string& name) { return ::testing::TempDir() + "/" + name; }

void write_sample(const std::string& path) {
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-1.5f};
  write_safetensors(path, {{"a", {2, 3}, a.data()}, {"b", {1}, b.data()}}, {{"note", "hi"}});
}

}  // namespace

TEST(Safetensors, RoundTrip) {
  const auto p = tmp("rt.safetensors");
  write_sample(p);
  SafetensorsReader r(p);
  EXPECT_EQ(r.read_f32("a", {2, 3}), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(r.read_f32("b", {1}), (std::vector<float>{-1.5f}));
  EXPECT_EQ(r.metadata().at("note"), "hi");
  EXPECT_EQ(r.names(), (std::vector<std::string>{"a", "b"}));
  // Data section is 8-byte aligned.
  const std::string bytes = read_file(p);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  EXPECT_EQ((8 + hlen) % 8, 0u);
}

TEST(Safetensors, Errors) {
  const auto p = tmp("err.safetensors");
  write_sample(p);
  SafetensorsReader r(p);
  EXPECT_NE(error_of([&] { r.read_f32("a", {3, 2}); }).find("has shape [2, 3], expected [3, 2]"), std::string::npos);
  EXPECT_NE(error_of([&] { r.read_f32("zzz", {1}); }).find("missing tensor \"zzz\""), std::string::npos);
  const std::string bytes = read_file(p);
  write_file_atomic(p, bytes.substr(0, bytes.size() - 4));
  EXPECT_NE(error_of([&] { SafetensorsReader x(p); }).find("truncated"), std::string::npos);
  std::string flipped = bytes;
  flipped[flipped.size() - 1] ^= 1;
  write_file_atomic(p, flipped);
  EXPECT_NE(error_of([&] { SafetensorsReader x(p); }).find("checksum mismatch"), std::string::npos);
  std::string bad_header = bytes;
  bad_header[9] = '!';
  write_file_atomic(p, bad_header);
  EXPECT_NE(error_of([&] { SafetensorsReader x(p); }).find("corrupt safetensors header"), std::string::npos);
  write_file_atomic(p, std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}");
  EXPECT_NE(error_of([&] { SafetensorsReader x(p); }).find("exceeds file size"), std::string::npos);
}

namespace {
// A hand-made file: header text and data bytes, no checksum.
std::string raw_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}
std::string parse_error(const std::string& bytes, bool require_checksum = false) {
  return error_of([&] { SafetensorsReader r(bytes, "x.safetensors", require_checksum); });
}
}  // namespace

TEST(Safetensors, ChecksumCoversTheHeader) {
  // A training state's step is a digit in the header: changing it must be caught.
  const auto p = tmp("state.safetensors");
  const std::vector<float> a = {1, 2};
  write_safetensors(p, {{"a", {2}, a.data()}}, {{"step", "20"}});
  const std::string bytes = read_file(p);
  EXPECT_EQ(SafetensorsReader(bytes, p, true).metadata().at("step"), "20");
  std::string edited = bytes;
  edited.replace(edited.find("\"20\""), 4, "\"30\"");
  EXPECT_NE(parse_error(edited).find("checksum mismatch"), std::string::npos);
  std::string shape = bytes;
  shape[shape.find("[2]") + 1] = '1';  // shape [1] over 8 bytes: caught before the checksum
  EXPECT_NE(parse_error(shape).find("does not match F32 [1]"), std::string::npos);
  // Every byte of the file is covered: flip each one in turn.
  int caught = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string f = bytes;
    f[i] ^= 0x04;
    caught += parse_error(f, true).empty() ? 0 : 1;
  }
  EXPECT_EQ(caught, int(bytes.size()));
  // A file without loco's checksum is refused where one is required.
  const std::string plain = raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  EXPECT_TRUE(parse_error(plain).empty());
  EXPECT_NE(parse_error(plain, true).find("no loco.file_checksum"), std::string::npos);
}

TEST(Safetensors, HeaderIsValidatedStrictly) {
  const std::string d8(8, '\0');
  auto entry = [](const std::string& name, const std::string& shape, int b, int e, const std::string& dtype = "F32") {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
           std::to_string(b) + "," + std::to_string(e) + "]}";
  };
  EXPECT_TRUE(parse_error(raw_file("{" + entry("a", "[1]", 0, 4) + "," + entry("b", "[1]", 4, 8) + "}", d8)).empty());
  EXPECT_NE(parse_error(raw_file("{" + entry("a", "[1]", 0, 4) + "," + entry("a", "[1]", 4, 8) + "}", d8))
                .find("lists \"a\" twice"),
            std::string::npos);
  EXPECT_NE(parse_error(raw_file("{" + entry("a", "[2]", 0, 8) + "," + entry("b", "[1]", 4, 8) + "}", d8))
                .find("overlaps"),
            std::string::npos);
  EXPECT_NE(parse_error(raw_file("{" + entry("a", "[1]", 0, 4) + "}", d8)).find("belong to no tensor"),
            std::string::npos);
  EXPECT_NE(parse_error(raw_file("{" + entry("a", "[1]", 4, 8) + "}", d8)).find("a gap before it"), std::string::npos);
  EXPECT_NE(parse_error(raw_file("{" + entry("a", "[4611686018427387904,4]", 0, 8) + "}", d8)).find("too large"),
            std::string::npos);
  EXPECT_NE(parse_error(raw_file("{" + entry("a", "[2]", 0, 8, "Q7") + "}", d8)).find("unknown dtype"),
            std::string::npos);
  EXPECT_TRUE(parse_error(raw_file("{" + entry("a", "[4]", 0, 8, "BF16") + "}", d8)).empty());
  // Numbers that are not integers (a fuzzer's 1e57 converted with undefined behaviour).
  const std::string floats = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,1e57]}})";
  EXPECT_NE(parse_error(raw_file(floats, d8)).find("data_offsets must be a list of non-negative integers"),
            std::string::npos);
  const std::string negative = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,8]}})";
  EXPECT_NE(parse_error(raw_file(negative, d8)).find("non-negative integers"), std::string::npos);
  const std::string fshape = R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})";
  EXPECT_NE(parse_error(raw_file(fshape, d8)).find("shape must be a list of integers"), std::string::npos);
}

TEST(Fs, JsonIntegerRefusesFloatsAndMissingKeys) {
  const auto j = nlohmann::json::parse(R"({"a": 3, "b": 1e57, "c": -2, "d": "4"})");
  EXPECT_EQ(json_integer(j, "a", "x"), 3);
  EXPECT_EQ(json_integer(j, "c", "x"), -2);
  for (const char* key : {"b", "d", "e"}) EXPECT_THROW(json_integer(j, key, "x"), std::runtime_error);
}

TEST(Fs, AtomicWriteLeavesNoTemporaryFile) {
  const std::string dir = tmp("atomic");
  std::filesystem::remove_all(dir);
  make_dirs(dir);
  write_file_atomic(dir + "/f", "one");
  write_file_atomic(dir + "/f", "two");
  EXPECT_EQ(read_file(dir + "/f"), "two");
  int files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1);
}

// A state's tensors that nothing took are named (a state of another method or configuration would
// otherwise be loaded with them dropped): a missing or wrongly sized one fails at take(), one
// taken, or counted as taken by a caller that reads it itself, is not named.
TEST(TrainingState, CheckAllTakenNamesWhatNothingTook) {
  TrainingState st;
  st.tensors = {{"outer.params", {1, 2}}, {"outer.momentum", {0, 0}}, {"extra", {3}}, {"pending.4.avg", {5}}};
  std::vector<float> out(2);
  st.take("outer.params", out);
  EXPECT_EQ(out, (std::vector<float>{1, 2}));
  std::vector<float> wrong(3);
  EXPECT_THROW(st.take("outer.momentum", wrong), Error);
  EXPECT_THROW(st.take("absent", out), Error);
  st.taken_by_caller("outer.momentum");
  try {
    st.check_all_taken("replica-0.safetensors");
    FAIL() << "untaken tensors accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "replica-0.safetensors: the state holds tensor(s) this run does not read: extra, "
                           "pending.4.avg (saved by another method or configuration, or edited)");
  }
  std::vector<float> one(1);
  st.take("extra", one);
  st.take("pending.4.avg", one);
  EXPECT_NO_THROW(st.check_all_taken("replica-0.safetensors"));

  TrainingState many;
  for (int i = 0; i < 11; ++i) many.tensors["t" + std::to_string(i)] = {float(i)};
  try {
    many.check_all_taken("s");
    FAIL() << "untaken tensors accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t0, t1, t10, t2, t3, t4, t5, t6 and 3 more"), std::string::npos) << e.what();
  }
}
