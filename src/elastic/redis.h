#pragma once
// A small Redis client (hiredis underneath) for the elastic backend's coordinator: membership,
// heartbeats, rosters and rendezvous keys. Every command is bounded by the client's timeout;
// a broken connection is reopened once per command. Failures throw RedisError, whose
// `unavailable` says the server could not be reached (the caller may retry later) rather than
// that it refused the command.
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

struct redisContext;

namespace loco {

class RedisError : public std::runtime_error {
 public:
  RedisError(const std::string& what, bool unavailable) : std::runtime_error(what), unavailable(unavailable) {}
  const bool unavailable;
};

// Where an elastic run is coordinated: redis://HOST:PORT/RUN (RUN names the run; its keys are
// prefixed "loco:RUN:").
struct JoinAddress {
  std::string host;
  int port = 6379;
  std::string run;
};
// Parses redis://HOST[:PORT]/RUN (HOST a name, an IPv4 address or [IPv6]); fails with a message
// naming what is wrong.
JoinAddress parse_join_url(const std::string& url);
// The longest run or worker name (a worker's name is also its run directory's).
constexpr size_t kMaxElasticName = 100;

struct RedisReply {
  enum class Type { Nil, Integer, String, Status, Array } type = Type::Nil;
  long long integer = 0;
  std::string str;                    // String, Status
  std::vector<std::string> elements;  // Array (of strings; nil elements become "")
  bool nil() const { return type == Type::Nil; }
};

class Redis {
 public:
  // Connects (and authenticates when `password` is not empty); throws RedisError.
  Redis(std::string host, int port, std::string password, double timeout_s);
  ~Redis();
  Redis(const Redis&) = delete;
  Redis& operator=(const Redis&) = delete;

  // Runs one command (binary-safe arguments). A server error reply throws RedisError
  // (unavailable = false); a lost connection is reopened once, then throws (unavailable = true).
  RedisReply command(const std::vector<std::string>& args);

  // Conveniences over command().
  bool set_nx(const std::string& key, const std::string& value);  // true if this call set it
  void set_px(const std::string& key, const std::string& value, int64_t ttl_ms);
  std::string get(const std::string& key, bool* found = nullptr);
  bool exists(const std::string& key);
  long long incr(const std::string& key);
  void sadd(const std::string& key, const std::string& member);
  std::vector<std::string> smembers(const std::string& key);
  void rpush(const std::string& key, const std::string& value);
  std::vector<std::string> lrange(const std::string& key, long long first, long long last);

  // Commands slower than `seconds` count as trouble (the server stalled); the steady-clock time
  // (seconds) at which the latest slow or failed command ended, or -inf.
  void set_stall_threshold(double seconds) { stall_s_ = seconds; }
  double trouble_end_s() const { return trouble_end_s_.load(); }

 private:
  void connect();
  std::string host_, password_;
  int port_;
  double timeout_s_;
  std::mutex mu_;
  redisContext* ctx_ = nullptr;
  double stall_s_ = 1e300;
  std::atomic<double> trouble_end_s_{-1e300};
};

}  // namespace loco
