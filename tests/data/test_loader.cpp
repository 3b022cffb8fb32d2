#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "data/loader.h"

using namespace loco;

namespace {
std::shared_ptr<const std::vector<int32_t>> counting_tokens(int n) {
  auto v = std::make_shared<std::vector<int32_t>>(n);
  for (int i = 0; i < n; ++i) (*v)[i] = i;  // token value = position, so windows identify themselves
  return v;
}
}  // namespace

TEST(Loader, ReplicasAreDisjointWithinAnEpochAndCoverIt) {
  const int seq = 8, batch = 3, M = 4;
  auto toks = counting_tokens(8 * 100 + 1);  // 100 windows -> 25 per replica
  std::set<int32_t> starts;
  for (int r = 0; r < M; ++r) {
    DataLoader dl(toks, seq, batch, r, M, 42);
    EXPECT_EQ(dl.windows_per_epoch(), 25);
    std::vector<int32_t> in, tgt;
    for (int b = 0; b < 8; ++b) {  // 24 of this replica's 25 windows
      dl.next(in, tgt);
      for (int w = 0; w < batch; ++w) {
        const int32_t start = in[size_t(w) * seq];
        EXPECT_EQ(start % seq, 0);
        EXPECT_TRUE(starts.insert(start).second) << "window " << start / seq << " served twice";
        for (int i = 0; i < seq; ++i) {
          EXPECT_EQ(in[size_t(w) * seq + i], start + i);
          EXPECT_EQ(tgt[size_t(w) * seq + i], start + i + 1);
        }
      }
    }
  }
  EXPECT_EQ(starts.size(), size_t(M * 24));
}

TEST(Loader, DeterministicSeededAndResumable) {
  auto toks = counting_tokens(4 * 50 + 1);
  auto take = [&](uint64_t seed, int batches, DataLoader::Position* resume_at, DataLoader::Position* pos_out) {
    DataLoader dl(toks, 4, 2, 1, 2, seed);
    if (resume_at) dl.set_position(*resume_at);
    std::vector<int32_t> all, in, tgt;
    for (int b = 0; b < batches; ++b) {
      dl.next(in, tgt);
      all.insert(all.end(), in.begin(), in.end());
    }
    if (pos_out) *pos_out = dl.position();
    return all;
  };
  EXPECT_EQ(take(7, 30, nullptr, nullptr), take(7, 30, nullptr, nullptr));
  EXPECT_NE(take(7, 30, nullptr, nullptr), take(8, 30, nullptr, nullptr));
  // 30 batches cross the epoch boundary (25 windows per replica per epoch = 12.5 batches).
  DataLoader::Position mid;
  const auto first = take(7, 17, nullptr, &mid);
  const auto rest = take(7, 13, &mid, nullptr);
  auto joined = first;
  joined.insert(joined.end(), rest.begin(), rest.end());
  EXPECT_EQ(joined, take(7, 30, nullptr, nullptr));
  EXPECT_EQ(mid.epoch, 1);
}

TEST(Loader, TooLittleDataIsAnError) {
  EXPECT_THROW(DataLoader(counting_tokens(40), 8, 4, 0, 2, 1), Error);
}

// Elastic runs: members change between rounds (4, then 3 after one died, then 5 after two
// joined). Each round's members continue where the previous round's rows ended, so within an
// epoch no window is taken twice, the windows of a member that died are skipped (lost, not
// retrained), and with a fixed membership assign() reproduces the plain loader exactly.
TEST(Loader, ElasticAssignmentsContinueWithoutRepeats) {
  const int seq = 4, batch = 2;
  auto toks = counting_tokens(4 * 200 + 1);  // 200 windows
  std::vector<int32_t> in, tgt, in2, tgt2;
  {  // fixed membership: assign(r, M, 0, 0) == the plain loader
    DataLoader plain(toks, seq, batch, 2, 4, 7), assigned(toks, seq, batch, 0, 1, 7);
    assigned.assign(2, 4, 0, 0);
    for (int b = 0; b < 40; ++b) {  // crosses into the next epoch
      plain.next(in, tgt);
      assigned.next(in2, tgt2);
      ASSERT_EQ(in, in2) << "batch " << b;
    }
  }
  std::set<int32_t> seen;
  DataLoader::Position start{0, 0, 0};
  for (const int M : {4, 3, 5}) {
    DataLoader::Position next{};
    for (int r = 0; r < M; ++r) {
      DataLoader dl(toks, seq, batch, 0, 1, 7);
      dl.assign(r, M, start.epoch, start.offset);
      for (int step = 0; step < 5; ++step) {  // one round of 5 inner steps
        dl.next(in, tgt);
        for (int w = 0; w < batch; ++w) EXPECT_TRUE(seen.insert(in[size_t(w) * seq]).second) << "M " << M;
      }
      if (r == 0) next = dl.next_start();
      EXPECT_EQ(dl.next_start(), next);  // every member agrees where the next round starts
    }
    EXPECT_EQ(next.epoch, 0);
    EXPECT_EQ(next.offset, start.offset + 5 * batch * M);
    start = next;
  }
  EXPECT_EQ(seen.size(), size_t(5 * batch * (4 + 3 + 5)));
  // An epoch whose remaining rows run out moves to the next epoch at offset 0.
  DataLoader dl(toks, seq, batch, 0, 1, 7);
  dl.assign(1, 3, 0, 195);  // 5 windows left: one row of 3; the batch's second window is epoch 1's
  dl.next(in, tgt);         // first row, so the next round starts at epoch 1, entry 3
  EXPECT_EQ(dl.next_start(), (DataLoader::Position{1, 0, 3}));
}
