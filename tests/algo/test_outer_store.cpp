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

// exchange() takes a fragment's new state: in memory by swapping buffers of its exact size (the
// store then holds the very buffer given, and gives back its old one), else by copying; the
// values are those given either way, and the other fragments are untouched.
TEST(OuterStore, ExchangeSwapsBuffersOfTheFragmentsSizeAndCopiesOthers) {
  const std::vector<std::vector<Range>> fragments = {{{0, 3}, {9, 12}}, {{3, 9}}};
  const int64_t n = 12;
  const std::string file = (std::filesystem::temp_directory_path() / "loco-outer-store-test3.scratch").string();
  OuterStore mem(fragments, n, ""), disk(fragments, n, file);
  std::vector<float> theta(static_cast<size_t>(n)), momentum(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    theta[size_t(i)] = float(i);
    momentum[size_t(i)] = float(-i);
  }
  mem.write_all(theta, momentum);
  disk.write_all(theta, momentum);
  for (OuterStore* st : {&mem, &disk}) {
    std::vector<float> t = {10, 11, 12, 13, 14, 15}, m = {20, 21, 22, 23, 24, 25};
    const float* given = t.data();
    st->exchange(0, t, m);
    if (st == &mem) {
      EXPECT_EQ(mem.resident_theta(0), given);  // the buffer itself, no copy
      ASSERT_EQ(t.size(), 6u);                   // the store's old buffer, given back
    } else {
      EXPECT_EQ(disk.resident_theta(0), nullptr);
    }
    std::vector<float> big;
    big.reserve(64);  // a larger buffer than the fragment's: copied
    big.assign({30, 31, 32, 33, 34, 35});
    std::vector<float> big_m = {40, 41, 42, 43, 44, 45};
    const float* big_data = big.data();
    st->exchange(1, big, big_m);
    if (st == &mem) EXPECT_NE(mem.resident_theta(1), big_data);
    std::vector<float> a, b;
    st->read_all(a, b);
    EXPECT_EQ(a, std::vector<float>({10, 11, 12, 30, 31, 32, 33, 34, 35, 13, 14, 15}));
    EXPECT_EQ(b, std::vector<float>({20, 21, 22, 40, 41, 42, 43, 44, 45, 23, 24, 25}));
  }
  EXPECT_EQ(mem.resident_bytes(), 8 * n);
}

TEST(OuterStore, ScratchFileIsRemoved) {
  const std::string file = (std::filesystem::temp_directory_path() / "loco-outer-store-test2.scratch").string();
  { OuterStore s({{{0, 4}}}, 4, file); }
  EXPECT_FALSE(std::filesystem::exists(file));
}
