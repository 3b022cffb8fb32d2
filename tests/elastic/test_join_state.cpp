// The state a joiner receives (elastic/join_state.h): every field survives the wire exactly, the
// screening history included, and bytes that do not hold a valid state are refused with an
// error, never used.
#include <gtest/gtest.h>

#include <cstring>

#include "core/checksum.h"
#include "core/error.h"
#include "elastic/join_state.h"

using namespace loco;

namespace {

JoinState sample() {
  JoinState s;
  s.step = 35;
  s.data_epoch = 2;
  s.data_offset = 17;
  s.optimizer_steps = 35;
  s.epoch = {3, 7};
  s.outer.theta = {1.5f, -2.0f, 0.25f};
  s.outer.momentum = {0.1f, 0.2f, 0.3f};
  s.m = {4.0f, 5.0f};
  s.v = {6.0f, 7.0f};
  s.outer.norm_history.resize(2);
  s.outer.norm_history[0].recent = {3.218, 1.0 / 3, 0.9130892770814124};
  return s;
}

// Bytes with the header replaced by `head` and a valid checksum: what a member holding the run's
// secret could send.
std::string with_header(const std::string& bytes, const std::string& head) {
  uint64_t hn;
  std::memcpy(&hn, bytes.data(), 8);
  std::string out(8, '\0');
  const uint64_t n = head.size();
  std::memcpy(out.data(), &n, 8);
  out += head;
  out.append(bytes, 8 + hn, bytes.size() - 8 - hn - 4);
  const uint32_t crc = crc32c(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(&crc), 4);
  return out;
}

std::string error_of(const std::string& bytes, size_t histories = 2) {
  try {
    decode_join_state(bytes, 3, 2, histories);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(JoinState, EveryFieldSurvivesTheWireExactly) {
  const JoinState s = sample();
  const JoinState back = decode_join_state(encode_join_state(s), 3, 2, 2);
  EXPECT_EQ(back.step, 35);
  EXPECT_EQ(back.data_epoch, 2);
  EXPECT_EQ(back.data_offset, 17);
  EXPECT_EQ(back.optimizer_steps, 35);
  EXPECT_EQ(back.epoch, s.epoch);
  EXPECT_EQ(back.outer.theta, s.outer.theta);
  EXPECT_EQ(back.outer.momentum, s.outer.momentum);
  EXPECT_EQ(back.m, s.m);
  EXPECT_EQ(back.v, s.v);
  ASSERT_EQ(back.outer.norm_history.size(), 2u);
  EXPECT_EQ(back.outer.norm_history[0].recent, s.outer.norm_history[0].recent);  // bit for bit: members screen alike
  EXPECT_TRUE(back.outer.norm_history[1].recent.empty());
}

TEST(JoinState, BadBytesAreRefused) {
  const std::string good = encode_join_state(sample());
  std::string flipped = good;
  flipped[20] ^= 1;
  EXPECT_NE(error_of(flipped).find("checksum mismatch"), std::string::npos);
  EXPECT_NE(error_of(good.substr(0, 5)).find("too short"), std::string::npos);
  EXPECT_NE(error_of(good, 1).find("has 2 entries, expected 1"), std::string::npos) << error_of(good, 1);
  // A header with a valid checksum but a hostile history: refused, naming it.
  uint64_t hn;
  std::memcpy(&hn, good.data(), 8);
  auto head = nlohmann::json::parse(good.substr(8, hn));
  for (const char* bad : {"[[1e308, -1], []]", "[[1], [2, 2, 2, 2, 2, 2, 2, 2, 2]]", "{}", "[[\"x\"], []]"}) {
    head["norm_history"] = bad;
    const std::string e = error_of(with_header(good, head.dump()));
    EXPECT_NE(e.find("the state received from a peer: the screening history"), std::string::npos) << bad << ": " << e;
  }
  head["norm_history"] = 5;  // not even text
  EXPECT_NE(error_of(with_header(good, head.dump())), "");
  head["norm_history"] = "[[1.5], [2.5]]";
  EXPECT_EQ(decode_join_state(with_header(good, head.dump()), 3, 2, 2).outer.norm_history[1].recent, std::vector<double>{2.5});
}

// Partial updates: the slice whose optimizer state the joiner receives survives the wire, and a
// state without one (nobody in the round trains the joiner's slice) holds no moments and no
// inner bytes; a header claiming a negative slice, or no optimizer state while bytes of one
// follow, is refused.
TEST(JoinState, SliceAndMissingOptimizerState) {
  JoinState s = sample();
  s.slice = 1;
  JoinState back = decode_join_state(encode_join_state(s), 3, 2, 2);
  EXPECT_EQ(back.slice, 1);
  EXPECT_TRUE(back.has_optimizer);
  EXPECT_EQ(back.m, s.m);
  s.has_optimizer = false;
  s.m.clear();
  s.v.clear();
  back = decode_join_state(encode_join_state(s), 3, 2, 2);
  EXPECT_FALSE(back.has_optimizer);
  EXPECT_TRUE(back.m.empty() && back.v.empty() && back.inner.empty());
  EXPECT_EQ(back.outer.theta, s.outer.theta);
  const std::string good = encode_join_state(sample());
  uint64_t hn;
  std::memcpy(&hn, good.data(), 8);
  auto head = nlohmann::json::parse(good.substr(8, hn));
  head["slice"] = -3;
  EXPECT_NE(error_of(with_header(good, head.dump())).find("(slice)"), std::string::npos);
  head["slice"] = 1;
  head["has_optimizer"] = false;  // while m and v follow: the sizes do not add up
  EXPECT_NE(error_of(with_header(good, head.dump())).find("(size)"), std::string::npos);
  JoinState inner = sample();
  inner.m.clear();
  inner.v.clear();
  inner.inner = "bytes";
  const std::string with_inner = encode_join_state(inner);
  std::memcpy(&hn, with_inner.data(), 8);
  head = nlohmann::json::parse(with_inner.substr(8, hn));
  head["has_optimizer"] = false;
  try {
    decode_join_state(with_header(with_inner, head.dump()), 3, 0, 2);
    ADD_FAILURE() << "an inner state without has_optimizer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer state without has_optimizer"), std::string::npos) << e.what();
  }
}
