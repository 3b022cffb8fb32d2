// Where an elastic worker joins (redis://HOST:PORT/RUN) and its name come from the command line
// or Python: each malformed one is refused with the reason, and nothing unbounded is accepted.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "../error_of.h"
#include "elastic/options.h"
#include "elastic/redis.h"

using namespace loco;

namespace {
std::string refusal(const std::string& url) {
  return test::error_of([&] { parse_join_url(url); });
}
}  // namespace

TEST(JoinUrl, NamesIPv4AndBracketedIPv6) {
  const auto a = parse_join_url("redis://redis_1.lab-net:7000/run-2.b");
  EXPECT_EQ(a.host, "redis_1.lab-net");
  EXPECT_EQ(a.port, 7000);
  EXPECT_EQ(a.run, "run-2.b");
  EXPECT_EQ(parse_join_url("redis://10.0.0.7/r").port, 6379);
  const auto v6 = parse_join_url("redis://[::1]:6380/r");
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.port, 6380);
  EXPECT_EQ(parse_join_url("redis://[fe80::1]/r").host, "fe80::1");
}

TEST(JoinUrl, RefusesMalformedAddressesSayingWhy) {
  const std::pair<std::string, std::string> cases[] = {
      {"http://h/r", "not a redis:// address"},
      {"redis://h:6379/", "no run name"},
      {"redis://h:6379", "no run name"},
      {"redis://:6379/r", "no host"},
      {"redis://h:99999/r", "port out of range"},
      {"redis://h:x/r", "bad port"},
      {"redis://h/a/b", "the run name may hold only"},
      {"redis://[::1:6379/r", "no ']' after an IPv6 address"},
      {"redis://[::1]6379/r", "expected ':PORT' after ']'"},
      {"redis://[host]:1/r", "not an IPv6 address"},
      {"redis://h st:1/r", "the host may hold only"},
      {"redis://::1:6379/r", "the host may hold only"},
      {"redis://h/" + std::string(101, 'x'), "more than 100 characters"},
      {"redis://" + std::string(2000, 'h') + "/r", "2010 characters, not an address"},
  };
  for (const auto& [url, why] : cases) EXPECT_NE(refusal(url).find(why), std::string::npos) << url << ": " << refusal(url);
  EXPECT_EQ(parse_join_url("redis://h/" + std::string(100, 'x')).run.size(), 100u);
}

TEST(JoinUrl, WorkerNamesAreBounded) {
  EXPECT_NO_THROW(check_worker_name(std::string(100, 'w')));
  EXPECT_THROW(check_worker_name(std::string(101, 'w')), Error);
  EXPECT_THROW(check_worker_name(".."), Error);
  EXPECT_THROW(check_worker_name("a/b"), Error);
  EXPECT_THROW(check_worker_name(""), Error);
}
