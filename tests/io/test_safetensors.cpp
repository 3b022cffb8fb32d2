#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/fs.h"
#include "io/safetensors.h"

using namespace loco;

namespace {

std::string tmp(const std::string& name) { return ::testing::TempDir() + "/" + name; }

void write_sample(const std::string& path) {
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-1.5f};
  write_safetensors(path, {{"a", {2, 3}, a.data()}, {"b", {1}, b.data()}}, {{"note", "hi"}});
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
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
