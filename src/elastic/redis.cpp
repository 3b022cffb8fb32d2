#include "elastic/redis.h"

#include <hiredis/hiredis.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <iostream>
#include <sys/time.h>

#include "core/error.h"

namespace loco {

JoinAddress parse_join_url(const std::string& url) {
  const std::string scheme = "redis://";
  auto bad = [&](const std::string& why) {
    fail("--join " + url + ": " + why + " (expected redis://HOST:PORT/RUN)");
  };
  if (url.size() > 1024) fail("--join " + url.substr(0, 40) + "...: " + std::to_string(url.size()) + " characters, not an address");
  if (url.compare(0, scheme.size(), scheme) != 0) bad("not a redis:// address");
  const std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  if (slash == std::string::npos) bad("no run name");
  JoinAddress a;
  const std::string hostport = rest.substr(0, slash);
  a.run = rest.substr(slash + 1);
  if (a.run.empty()) bad("no run name");
  if (a.run.size() > kMaxElasticName) bad("the run name has more than " + std::to_string(kMaxElasticName) + " characters");
  for (const char c : a.run)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      bad("the run name may hold only letters, digits, '-', '_' and '.'");
  // HOST is a name, an IPv4 address or an IPv6 address in brackets ([::1]:6379).
  size_t colon = hostport.rfind(':');
  if (!hostport.empty() && hostport[0] == '[') {
    const size_t close = hostport.find(']');
    if (close == std::string::npos) bad("no ']' after an IPv6 address");
    a.host = hostport.substr(1, close - 1);
    if (close + 1 < hostport.size() && hostport[close + 1] != ':') bad("expected ':PORT' after ']'");
    colon = close + 1 < hostport.size() ? close + 1 : std::string::npos;
    for (const char c : a.host)
      if (!(std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.')) bad("not an IPv6 address in '[...]'");
  } else {
    a.host = colon == std::string::npos ? hostport : hostport.substr(0, colon);
    for (const char c : a.host)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
        bad("the host may hold only letters, digits, '-', '_' and '.' (an IPv6 address goes in '[...]')");
  }
  if (a.host.empty()) bad("no host");
  if (colon != std::string::npos) {
    const std::string p = hostport.substr(colon + 1);
    if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) bad("bad port");
    a.port = std::stoi(p);
    if (a.port < 1 || a.port > 65535) bad("port out of range");
  }
  return a;
}

namespace {

timeval to_timeval(double s) {
  timeval tv;
  tv.tv_sec = time_t(std::floor(s));
  tv.tv_usec = suseconds_t((s - std::floor(s)) * 1e6);
  return tv;
}

RedisReply convert(const redisReply* r) {
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_NIL: out.type = RedisReply::Type::Nil; break;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::Integer;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
      out.type = r->type == REDIS_REPLY_STRING ? RedisReply::Type::String : RedisReply::Type::Status;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::Array;
      for (size_t i = 0; i < r->elements; ++i) {
        const redisReply* e = r->element[i];
        out.elements.push_back(e->type == REDIS_REPLY_STRING || e->type == REDIS_REPLY_STATUS
                                   ? std::string(e->str, e->len)
                                   : e->type == REDIS_REPLY_INTEGER ? std::to_string(e->integer) : std::string());
      }
      break;
    default: break;
  }
  return out;
}

}  // namespace

Redis::Redis(std::string host, int port, std::string password, double timeout_s)
    : host_(std::move(host)), password_(std::move(password)), port_(port), timeout_s_(timeout_s) {
  std::lock_guard<std::mutex> lock(mu_);
  connect();
}

Redis::~Redis() {
  if (ctx_) redisFree(ctx_);
}

void Redis::connect() {
  if (ctx_) {
    redisFree(ctx_);
    ctx_ = nullptr;
  }
  const std::string where = "Redis at " + host_ + ":" + std::to_string(port_);
  redisContext* c = redisConnectWithTimeout(host_.c_str(), port_, to_timeval(timeout_s_));
  if (!c) throw RedisError(where + ": out of memory", true);
  if (c->err) {
    const std::string e = c->errstr;
    redisFree(c);
    throw RedisError(where + " is unreachable: " + e, true);
  }
  redisSetTimeout(c, to_timeval(timeout_s_));
  ctx_ = c;
  if (!password_.empty()) {
    const char* argv[] = {"AUTH", password_.c_str()};
    const size_t len[] = {4, password_.size()};
    auto* r = static_cast<redisReply*>(redisCommandArgv(ctx_, 2, argv, len));
    if (!r) throw RedisError(where + ": connection lost during AUTH", true);
    const bool ok = r->type != REDIS_REPLY_ERROR;
    const std::string msg = ok ? "" : std::string(r->str, r->len);
    freeReplyObject(r);
    if (!ok) throw RedisError(where + " refused the password: " + msg, false);
  }
}

namespace {
double steady_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

namespace {
// The type of the key a command reads or adds to, as TYPE names it ("" for the others).
std::string expected_type(const std::string& command) {
  if (command == "SADD" || command == "SREM" || command == "SMEMBERS") return "set";
  if (command == "RPUSH" || command == "LRANGE" || command == "LLEN") return "list";
  if (command == "GET" || command == "INCR") return "string";
  return "";
}
}  // namespace

RedisReply Redis::command(const std::vector<std::string>& args) {
  std::lock_guard<std::mutex> lock(mu_);
  const double t0 = steady_s();
  struct Watch {  // marks trouble when the command failed or stalled
    Redis& r;
    double t0;
    bool ok = false;
    ~Watch() {
      const double t = steady_s();
      if (!ok || t - t0 > r.stall_s_) r.trouble_end_s_ = t;
    }
  } watch{*this, t0};
  std::vector<const char*> argv;
  std::vector<size_t> len;
  for (const auto& a : args) {
    argv.push_back(a.data());
    len.push_back(a.size());
  }
  for (int attempt = 0;; ++attempt) {
    if (!ctx_) connect();
    auto* r = static_cast<redisReply*>(redisCommandArgv(ctx_, int(argv.size()), argv.data(), len.data()));
    if (!r) {
      const std::string e = ctx_->errstr;
      redisFree(ctx_);
      ctx_ = nullptr;
      if (attempt == 0) continue;
      throw RedisError("Redis at " + host_ + ":" + std::to_string(port_) + ": " + e, true);
    }
    watch.ok = true;  // the server answered
    if (r->type == REDIS_REPLY_ERROR) {
      const std::string e(r->str, r->len);
      freeReplyObject(r);
      // loco writes each of its keys with one type: a key of another type was written by
      // someone else (a Redis writer without the run secret). Like any forged entry it carries
      // nothing of the run's: it is removed and the command runs again. Removed only while it
      // still has another type (atomically): a member that removed it first may already have
      // written the key anew, as the other members do at the same moment.
      const std::string type = expected_type(args[0]);
      if (e.rfind("WRONGTYPE", 0) == 0 && args.size() >= 2 && !type.empty() && attempt < 3) {
        std::cerr << "loco: warning: Redis key " << args[1] << " held a value of another type than loco writes "
                  << "there (not this run's: forged?); removed\n";
        static const std::string kDeleteIfOtherType =
            "local t = redis.call('TYPE', KEYS[1]).ok "
            "if t ~= 'none' and t ~= ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
        auto* d = static_cast<redisReply*>(redisCommand(ctx_, "EVAL %b 1 %b %b", kDeleteIfOtherType.data(),
                                                        kDeleteIfOtherType.size(), args[1].data(), args[1].size(),
                                                        type.data(), type.size()));
        if (d) freeReplyObject(d);
        continue;
      }
      throw RedisError("Redis " + args[0] + ": " + e, false);
    }
    RedisReply out = convert(r);
    freeReplyObject(r);
    return out;
  }
}

bool Redis::set_nx(const std::string& key, const std::string& value) {
  return !command({"SET", key, value, "NX"}).nil();
}

void Redis::set_px(const std::string& key, const std::string& value, int64_t ttl_ms) {
  command({"SET", key, value, "PX", std::to_string(ttl_ms)});
}

std::string Redis::get(const std::string& key, bool* found) {
  RedisReply r = command({"GET", key});
  if (found) *found = !r.nil();
  return r.str;
}

bool Redis::exists(const std::string& key) { return command({"EXISTS", key}).integer > 0; }
long long Redis::incr(const std::string& key) { return command({"INCR", key}).integer; }
void Redis::sadd(const std::string& key, const std::string& member) { command({"SADD", key, member}); }
std::vector<std::string> Redis::smembers(const std::string& key) { return command({"SMEMBERS", key}).elements; }
void Redis::rpush(const std::string& key, const std::string& value) { command({"RPUSH", key, value}); }
std::vector<std::string> Redis::lrange(const std::string& key, long long first, long long last) {
  return command({"LRANGE", key, std::to_string(first), std::to_string(last)}).elements;
}

}  // namespace loco
