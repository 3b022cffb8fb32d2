// The outer-state store gives the same values in memory and offloaded to a file.
#include <gtest/gtest.h>

#include <filesystem>

#include "algo/outer_store.h"
#include "core/rng.h"

using namespace loco;

TEST(OuterStore, FileAndMemoryHoldTheSameValues) {
  const std::vector<std::vector<Range>> fragments = {{{0, 5}, {20, 30}}, {{5, 20}}, {{30, 41}}};
  const int64_t n = 41;
  const std::string file = (std::filesystem::temp_directory_path() / "loco-outer-store-test.scratch").string();
  OuterStore mem(fragments, n, ""), disk(fragments, n, file);
  EXPECT_FALSE(mem.offloaded());
  EXPECT_TRUE(disk.offloaded());
  EXPECT_EQ(mem.resident_bytes(), 8 * n);
  EXPECT_EQ(disk.resident_bytes(), 0);
  Rng rng(3);
  std::vector<float> theta(static_cast<size_t>(n)), momentum(static_cast<size_t>(n));
  for (auto& x : theta) x = float(rng.normal());
  for (auto& x : momentum) x = float(rng.normal());
  mem.write_all(theta, momentum);
  disk.write_all(theta, momentum);
  for (size_t j = 0; j < fragments.size(); ++j) {
    std::vector<float> t1, m1, t2, m2;
    mem.read(j, t1, m1);
    disk.read(j, t2, m2);
    EXPECT_EQ(t1, t2);
    EXPECT_EQ(m1, m2);
    ASSERT_EQ(int64_t(t1.size()), total_size(fragments[j]));
    EXPECT_EQ(t1.front(), theta[size_t(fragments[j].front().begin)]);  // packed in range order
    for (auto& x : t1) x += 1.0f;
    for (auto& x : m1) x *= 2.0f;
    mem.write(j, t1, m1);
    disk.write(j, t1, m1);
  }
  std::vector<float> a, b, c, d;
  mem.read_all(a, b);
  disk.read_all(c, d);
  EXPECT_EQ(a, c);
  EXPECT_EQ(b, d);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(a[size_t(i)], theta[size_t(i)] + 1.0f);
    EXPECT_EQ(b[size_t(i)], momentum[size_t(i)] * 2.0f);
  }
  EXPECT_TRUE(std::filesystem::exists(file));
}

TEST(OuterStore, ScratchFileIsRemoved) {
  const std::string file = (std::filesystem::temp_directory_path() / "loco-outer-store-test2.scratch").string();
  { OuterStore s({{{0, 4}}}, 4, file); }
  EXPECT_FALSE(std::filesystem::exists(file));
}
