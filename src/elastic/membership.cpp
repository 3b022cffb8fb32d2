#include "elastic/membership.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <set>

#include "core/error.h"
#include "core/interrupt.h"
#include "elastic/fingerprint.h"

namespace loco {

namespace {

using SteadyClock = std::chrono::steady_clock;
double seconds_since(SteadyClock::time_point t) { return std::chrono::duration<double>(SteadyClock::now() - t).count(); }
// Every polling loop of the membership (the start, a joiner's wait to be taken in, a round's
// commit, a coordinator outage) pauses here: an interrupt (core/interrupt.h) ends it. Asked at
// most every 50 ms, as Communicator::wait asks (the embedding process's check may take Python's
// lock, and a round's commit polls every 5 ms).
void pause_ms(int ms) {
  thread_local SteadyClock::time_point asked{};
  if (SteadyClock::now() - asked >= std::chrono::milliseconds(50)) {
    asked = SteadyClock::now();
    if (interrupted()) throw Interrupted("interrupted while waiting on the run's coordinator");
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}
bool contains(const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// A count as written by a member: decimal digits only, no sign, no overflow.
bool parse_count(const std::string& text, int64_t& v) {
  if (text.empty() || text.size() > 18) return false;
  v = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  return true;
}
// A member id (positive).
bool parse_id(const std::string& text, int64_t& id) { return parse_count(text, id) && id > 0; }

// Keys of an attempt of a round after the start expire after this many seconds (a round's
// attempts are bounded far below it); round 0's stay, since a worker starting late reads them.
constexpr const char* kAttemptTtl = "21600";
constexpr int kMaxWarnings = 10;  // forged-entry warnings per worker, then one line saying so
constexpr const char* kDeleteIfSame =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

}  // namespace

std::string attempt_name(int64_t generation, int64_t round, int64_t attempt) {
  return (generation > 0 ? "g" + std::to_string(generation) + "." : std::string()) + std::to_string(round) + ":" +
         std::to_string(attempt);
}

int Roster::rank_of(int64_t id) const {
  for (size_t i = 0; i < contributors.size(); ++i)
    if (contributors[i] == id) return int(i);
  for (size_t i = 0; i < joiners.size(); ++i)
    if (joiners[i] == id) return int(contributors.size() + i);
  return -1;
}

nlohmann::json Roster::to_json() const { return {{"contributors", contributors}, {"joiners", joiners}}; }

Roster Roster::from_json(int64_t round, int64_t attempt, const std::string& text) {
  Roster r;
  r.round = round;
  r.attempt = attempt;
  try {
    const auto j = nlohmann::json::parse(text);
    r.contributors = j.at("contributors").get<std::vector<int64_t>>();
    r.joiners = j.at("joiners").get<std::vector<int64_t>>();
  } catch (const nlohmann::json::exception& e) {
    fail("elastic: roster " + std::to_string(round) + ":" + std::to_string(attempt) + " in the coordinator is corrupt (" +
         e.what() + ")");
  }
  return r;
}

Membership::Membership(ElasticOptions options) : opt_(std::move(options)), prefix_("loco:" + opt_.where.run + ":") {
  retry([&] {
    redis_ = std::make_unique<Redis>(opt_.where.host, opt_.where.port, opt_.password, std::max(1.0, opt_.timeout_s));
    beat_redis_ = std::make_unique<Redis>(opt_.where.host, opt_.where.port, opt_.password, std::max(1.0, opt_.timeout_s));
    redis_->set_stall_threshold(opt_.timeout_s / 4);
    beat_redis_->set_stall_threshold(opt_.timeout_s / 4);
  });
}

std::string Membership::seal(const std::string& k, const std::string& value) const {
  return value + "\n" + mac_entry(opt_.run_key, k, value);
}

bool Membership::open(const std::string& k, const std::string& entry, std::string& value) {
  const size_t cut = entry.rfind('\n');
  if (cut != std::string::npos && entry_mac_ok(opt_.run_key, k, entry.substr(0, cut), entry.substr(cut + 1))) {
    value = entry.substr(0, cut);
    return true;
  }
  const int n = ++warnings_;
  if (n <= kMaxWarnings)
    std::fprintf(stderr,
                 "loco: warning: elastic: ignoring an entry in Redis without this run's MAC (forged, corrupt or "
                 "moved): %s%s\n",
                 k.substr(0, 200).c_str(),
                 n == kMaxWarnings ? " (further such warnings from this worker are not shown)" : "");
  return false;
}

bool Membership::get_sealed(Redis& redis, const std::string& k, std::string& value) {
  bool have = false;
  const std::string entry = redis.get(k, &have);
  if (!have) return false;
  if (open(k, entry, value)) return true;
  redis.command({"EVAL", kDeleteIfSame, "1", k, entry});
  return false;
}

std::vector<int64_t> Membership::sealed_ids(Redis& redis, const std::string& set_key) {
  std::vector<int64_t> out;
  for (const auto& e : redis.smembers(set_key)) {
    std::string text;
    int64_t id = 0;
    if (open(set_key, e, text) && parse_id(text, id)) out.push_back(id);
  }
  return sorted(out);
}

void Membership::add_id(const std::string& set_key, int64_t id) {
  redis_->sadd(set_key, seal(set_key, std::to_string(id)));
  expire_attempt_key(set_key);
}

void Membership::expire_attempt_key(const std::string& k) {
  const std::string round_keys = key("round:"), start = round_key(0, 0);
  if (k.compare(0, round_keys.size(), round_keys) == 0 && k.compare(0, start.size(), start) != 0)
    redis_->command({"EXPIRE", k, kAttemptTtl});
}

Roster Membership::read_roster(int64_t generation, int64_t round, int64_t attempt, const std::string& text) const {
  Roster r = Roster::from_json(round, attempt, text);
  r.generation = generation;
  r.tag = mac_entry(opt_.run_key, "transport of roster " + r.key(), text).substr(0, 16);
  return r;
}

Membership::~Membership() {
  {
    std::lock_guard<std::mutex> lock(beat_mu_);
    stop_ = true;
  }
  beat_cv_.notify_all();
  if (beat_thread_.joinable()) beat_thread_.join();
  // Leaving: the others see it at once instead of after the heartbeat's TTL.
  try {
    if (id_ >= 0) redis_->command({"DEL", key("hb:" + std::to_string(id_))});
  } catch (const std::exception&) {
  }
}

double Membership::now_s() { return std::chrono::duration<double>(SteadyClock::now().time_since_epoch()).count(); }

bool Membership::in_outage_grace() const {
  const double end = std::max({outage_end_s_.load(), redis_ ? redis_->trouble_end_s() : -1e300,
                               beat_redis_ ? beat_redis_->trouble_end_s() : -1e300});
  return now_s() - end < opt_.timeout_s;
}

bool Membership::outage_over(Redis& redis) {
  // A Redis that restarted without its data has forgotten the run: ids would be handed out
  // again and rounds replayed. Stop instead of corrupting the run.
  if (id_ >= 0 && !redis.exists(key("member:" + std::to_string(id_)))) state_lost_ = true;
  outage_end_s_ = now_s();  // once Redis answers again
  return !state_lost_;
}

void Membership::check_state() {
  if (state_lost_)
    fail("elastic: the coordinator (Redis at " + opt_.where.host + ":" + std::to_string(opt_.where.port) +
         ") lost this run's state (restarted without its data, flushed or failed over?); stopping. Run Redis "
         "with persistence (appendonly yes) to ride out restarts");
}

void Membership::retry(const std::function<void()>& fn) {
  const auto t0 = SteadyClock::now();
  bool outage = false;
  for (;;) {
    try {
      if (outage && redis_) outage_over(*redis_);
      check_state();
      const double t = now_s();
      fn();
      // Redis stalled (stopped, overloaded) without failing: heartbeats may have lapsed meanwhile.
      if (now_s() - t > opt_.timeout_s / 4) outage_end_s_ = now_s();
      return;
    } catch (const RedisError& e) {
      if (!e.unavailable) fail(std::string("elastic coordinator: ") + e.what());
      outage = true;
      if (seconds_since(t0) > opt_.coordinator_timeout_s)
        fail("elastic: the coordinator (Redis at " + opt_.where.host + ":" + std::to_string(opt_.where.port) +
             ") has been unreachable for " + std::to_string(int(opt_.coordinator_timeout_s)) +
             " s (elastic.coordinator_timeout); stopping. Last error: " + e.what());
      pause_ms(500);
    }
  }
}

void Membership::beat() {
  const int64_t id = id_;
  if (id < 0) return;
  const std::string me = std::to_string(id);
  if (dropped(*beat_redis_, id)) return;  // dropped: never revived
  // Its member record is written once and never removed: gone means Redis lost the run while up
  // (FLUSHALL, a failover to an empty replica, eviction). Ids would be handed out again: stop at
  // the next round (check_state) rather than beat on.
  if (!beat_redis_->exists(key("member:" + me))) {
    state_lost_ = true;
    return;
  }
  beat_redis_->set_px(key("hb:" + me), seal(key("hb:" + me), opt_.name), int64_t(opt_.timeout_s * 1000));
}

void Membership::heartbeat_loop() {
  const auto interval = std::chrono::duration<double>(opt_.timeout_s / 5);
  std::unique_lock<std::mutex> lock(beat_mu_);
  bool beat_failed = false;
  while (!stop_) {
    lock.unlock();
    try {
      const double t = now_s();
      beat();
      if (now_s() - t > opt_.timeout_s / 4) outage_end_s_ = now_s();
      if (beat_failed) {
        beat_failed = false;
        outage_over(*beat_redis_);  // heartbeats lapsed meanwhile: nobody is judged by them for a while
      }
    } catch (const std::exception&) {
      beat_failed = true;  // the coordinator is unreachable: the main thread finds out at its next sync
    }
    lock.lock();
    beat_cv_.wait_for(lock, interval, [&] { return stop_; });
  }
}

void Membership::check_fingerprint() {
  if (opt_.fingerprint.empty()) return;
  const std::string k = key("config");
  std::string entry;
  retry([&] {
    redis_->set_nx(k, opt_.fingerprint + "\n" + mac_entry(opt_.run_key, k, opt_.fingerprint));
    entry = redis_->get(k);
  });
  const size_t cut = entry.rfind('\n');
  const std::string text = cut == std::string::npos ? "" : entry.substr(0, cut);
  if (cut == std::string::npos || !entry_mac_ok(opt_.run_key, k, text, entry.substr(cut + 1)))
    fail("elastic: the run's configuration in Redis (" + k + ") does not carry this run's MAC: this worker holds "
         "another run secret than the members (elastic.secret_file or $LOCO_RUN_SECRET), or the entry was forged");
  const auto run = nlohmann::json::parse(text, nullptr, false);
  const auto mine = nlohmann::json::parse(opt_.fingerprint);
  if (!run.is_object()) fail("elastic: the run's configuration in Redis (" + k + ") is malformed");
  const std::string diff = fingerprint_differences(mine, run);
  if (!diff.empty())
    fail("elastic: this worker's configuration differs from the run's, which its members must share (" + diff +
         "); start it with the run's settings");
}

void Membership::register_member() {
  check_fingerprint();
  retry([&] {
    // Ids are never reused: a counter set back (by a Redis writer) cannot hand out an id whose
    // record exists (written once, never removed).
    int64_t id = -1;
    for (int tries = 0; tries < 1000 && id < 0; ++tries) {
      const int64_t candidate = redis_->incr(key("next_id"));
      const std::string mk = key("member:" + std::to_string(candidate));
      // The record carries this worker's fingerprint: the closer that would take it in compares
      // it with its own (joiner_refusals), whatever the run's config entry in Redis says.
      const nlohmann::json record{{"name", opt_.name}, {"address", opt_.address}, {"fingerprint", opt_.fingerprint}};
      if (candidate > 0 && redis_->set_nx(mk, seal(mk, record.dump())))
        id = candidate;
    }
    if (id < 0) fail("elastic: no free member id in Redis after 1000 tries (key next_id tampered with?)");
    const std::string hb = key("hb:" + std::to_string(id));
    redis_->set_px(hb, seal(hb, opt_.name), int64_t(opt_.timeout_s * 1000));
    add_id(key("members"), id);
    rosters_seen_ = redis_->command({"LLEN", key("rosters")}).integer;
    std::string g;
    int64_t gen = 0;
    if (get_sealed(*redis_, key("generation"), g) && parse_count(g, gen)) generation_ = gen;
    id_ = id;
  });
  if (!beat_thread_.joinable()) beat_thread_ = std::thread([this] { heartbeat_loop(); });
}

bool Membership::dropped(Redis& redis, int64_t id) {
  std::string v;
  return get_sealed(redis, key("dropped:" + std::to_string(id)), v);
}

bool Membership::live(int64_t id) {
  std::string v;
  return get_sealed(*redis_, key("hb:" + std::to_string(id)), v) && !dropped(*redis_, id);
}

bool Membership::gone(int64_t id, std::map<int64_t, double>& missing_since) {
  if (dropped(*redis_, id)) return true;
  // The grace check comes after the read: a read that stalled (Redis stopped) starts the grace.
  std::string v;
  if (get_sealed(*redis_, key("hb:" + std::to_string(id)), v) || in_outage_grace()) {
    missing_since.erase(id);
    return false;
  }
  const double now = now_s();
  return now - missing_since.emplace(id, now).first->second >= opt_.timeout_s / 4;
}

std::string Membership::await_roster(const std::string& rk, double bound_s, const std::string& bound_message,
                                     const std::function<void()>& try_close) {
  const auto t0 = SteadyClock::now();
  retry([&] { add_id(rk + "arrived", id_); });
  for (;;) {
    bool have = false;
    std::string text;
    retry([&] {
      have = get_sealed(*redis_, rk + "roster", text);
      if (!have) try_close();
    });
    if (have) return text;
    if (seconds_since(t0) > bound_s) fail(bound_message);
    pause_ms(10);
  }
}

Roster Membership::start_roster() {
  if (generation_ > 0) return Roster{};  // a restarted run began long ago: this worker joins it
  const std::string rk = round_key(0, 0);
  const std::string text = await_roster(
      rk, opt_.start_timeout_s,
      "elastic: fewer than elastic.min_workers = " + std::to_string(opt_.min_workers) + " workers arrived within " +
          std::to_string(int(opt_.start_timeout_s)) + " s (elastic.start_timeout)",
      [&] {
        std::vector<int64_t> arrived, registered;
        for (const int64_t m : sealed_ids(*redis_, rk + "arrived"))
          if (live(m)) arrived.push_back(m);
        for (const int64_t m : sealed_ids(*redis_, key("members")))
          if (live(m)) registered.push_back(m);
        const bool everyone =
            std::all_of(registered.begin(), registered.end(), [&](int64_t m) { return contains(arrived, m); });
        if (int(arrived.size()) < opt_.min_workers || !everyone) return;
        Roster r;
        r.contributors = arrived;
        if (!redis_->set_nx(rk + "roster", seal(rk + "roster", r.to_json().dump()))) return;
        redis_->rpush(key("rosters"), "0:0");
        for (const int64_t m : arrived)
          log_event({{"event", "joined"}, {"member", m}, {"round", 0}, {"step", 0}, {"why", "started the run"}});
      });
  return read_roster(generation_, 0, 0, text);
}

bool Membership::close_roster(int64_t round, int64_t attempt, const std::vector<int64_t>& epoch, bool last_round,
                              int64_t round_tokens, Roster& out) {
  const std::string rk = round_key(round, attempt);
  const auto t0 = SteadyClock::now();
  std::map<int64_t, double> missing_since;
  // Bounded without a bound of its own: a member that does not come is dropped once its
  // heartbeat expires or elastic.straggler_timeout passes, and then the roster closes.
  const std::string text = await_roster(rk, 1e300, "", [&] {
    if (in_outage_grace()) return;  // heartbeats lapsed during an outage prove nothing yet
    const auto arrived = sealed_ids(*redis_, rk + "arrived");
    std::vector<int64_t> contributors, missing;
    for (const int64_t m : epoch) {
      const bool is_live = !gone(m, missing_since), came = contains(arrived, m);
      if (is_live && came)
        contributors.push_back(m);
      else if (!is_live || seconds_since(t0) > opt_.straggler_timeout_s)
        missing.push_back(m);
    }
    if (contributors.size() + missing.size() < epoch.size()) return;  // a live member is still coming
    Roster r;
    r.generation = generation_;
    r.round = round;
    r.attempt = attempt;
    std::vector<int64_t> joiners;
    if (!last_round)
      for (const int64_t j : sealed_ids(*redis_, key("joiners")))
        if (!contains(epoch, j) && live(j)) joiners.push_back(j);
    auto excluded = exclusions(round, attempt, epoch, joiners);
    for (auto& refusal : joiner_refusals(joiners))
      if (std::none_of(excluded.begin(), excluded.end(), [&](const auto& e) { return e.first == refusal.first; }))
        excluded.push_back(std::move(refusal));
    auto reason = [&](int64_t m) {
      for (const auto& [id, why] : excluded)
        if (id == m) return why;
      return std::string();
    };
    for (const int64_t m : contributors)
      if (reason(m).empty()) r.contributors.push_back(m);
    for (const int64_t j : joiners)
      if (reason(j).empty()) r.joiners.push_back(j);
    if (!redis_->set_nx(rk + "roster", seal(rk + "roster", r.to_json().dump()))) return;
    expire_attempt_key(rk + "roster");
    redis_->rpush(key("rosters"), r.key());
    for (const auto& [m, why] : excluded) {
      const std::string ek = key("excluded:" + std::to_string(m));
      redis_->command({"SET", ek, seal(ek, why)});
      if (contains(joiners, m)) {
        redis_->command({"SREM", key("joiners"), seal(key("joiners"), std::to_string(m))});
        log_event({{"event", "refused"}, {"member", m}, {"round", round}, {"why", why}});
      } else {
        missing.push_back(m);
      }
    }
    for (const int64_t m : missing) {
      const std::string dk = key("dropped:" + std::to_string(m));
      redis_->command({"SET", dk, seal(dk, "1")});
      const std::string why = reason(m);
      log_event({{"event", "left"},
                 {"member", m},
                 {"round", round},
                 {"tokens_lost", round_tokens},
                 {"why", !why.empty() ? "excluded: " + why
                         : live(m)    ? "did not arrive within elastic.straggler_timeout"
                                      : "heartbeat expired"}});
    }
  });
  out = read_roster(generation_, round, attempt, text);
  const bool in = contains(out.contributors, id_);
  if (!in) check_not_excluded();
  return in;
}

std::vector<std::pair<int64_t, std::string>> Membership::joiner_refusals(const std::vector<int64_t>& joiners) {
  std::vector<std::pair<int64_t, std::string>> out;
  if (opt_.fingerprint.empty()) return out;
  // The run's config entry, put back if someone removed or replaced it (a joiner that registered
  // meanwhile wrote its own): what later joiners compare with at registration.
  const std::string ck = key("config");
  const std::string entry = redis_->get(ck);
  const std::string mine = opt_.fingerprint + "\n" + mac_entry(opt_.run_key, ck, opt_.fingerprint);
  if (entry != mine) {
    std::cerr << "loco: elastic: the run's configuration entry in Redis was " << (entry.empty() ? "removed" : "replaced")
              << "; writing it again\n";
    redis_->command({"SET", ck, mine});
  }
  const auto run = nlohmann::json::parse(opt_.fingerprint);
  for (const int64_t j : joiners) {
    std::string info;
    std::string why;
    if (!get_sealed(*redis_, key("member:" + std::to_string(j)), info)) {
      why = "refused as a joiner: it has no member record";
    } else {
      const auto record = nlohmann::json::parse(info, nullptr, false);
      const auto theirs = record.is_object() && record.contains("fingerprint") && record["fingerprint"].is_string()
                              ? nlohmann::json::parse(record["fingerprint"].get<std::string>(), nullptr, false)
                              : nlohmann::json();
      const std::string diff = theirs.is_object() ? fingerprint_differences(theirs, run) : "no configuration given";
      if (!diff.empty())
        why = "refused as a joiner: its configuration differs from the run's, which its members must share (" +
              diff.substr(0, 300) + ")";
    }
    if (!why.empty()) out.emplace_back(j, why);
  }
  return out;
}

void Membership::blame(const Roster& roster, const std::vector<int64_t>& culprits) {
  if (culprits.empty()) return;
  const std::string rk = key("round:" + roster.key() + ":");
  retry([&] {
    for (const int64_t c : culprits) add_id(rk + "blame:" + std::to_string(c), id_);
  });
}

void Membership::check_not_excluded() {
  bool found = false;
  std::string why;
  retry([&] { found = get_sealed(*redis_, key("excluded:" + std::to_string(id_)), why); });
  if (found)
    fail("elastic: this worker (member " + std::to_string(id_) + ") was excluded from the run: " +
         why.substr(0, 400));
}

std::vector<std::pair<int64_t, std::string>> Membership::exclusions(int64_t round, int64_t attempt,
                                                                    const std::vector<int64_t>& epoch,
                                                                    const std::vector<int64_t>& joiners) {
  std::vector<std::pair<int64_t, std::string>> out;
  if (attempt == 0) return out;
  auto blamers = [&](int64_t a, int64_t m) {
    return sealed_ids(*redis_, round_key(round, a) + "blame:" + std::to_string(m));
  };
  auto names = [](const std::set<int64_t>& s) {
    std::string t;
    for (const int64_t m : s) t += (t.empty() ? "" : ", ") + std::to_string(m);
    return t;
  };
  for (const int64_t j : joiners) {
    const auto b = blamers(attempt - 1, j);
    if (!b.empty())
      out.emplace_back(j, "refused as a joiner: its state transfer in round " + std::to_string(round) +
                              " failed (member " + names({b.begin(), b.end()}) + ")");
  }
  const int k = opt_.exclude_after;
  if (attempt < k) return out;
  std::map<int64_t, std::set<int64_t>> by;  // member -> its distinct blamers over the last k attempts
  std::map<int64_t, int> times;             // member -> attempts it was blamed in
  for (int64_t a = attempt - k; a < attempt; ++a)
    for (const int64_t m : epoch) {
      const auto b = blamers(a, m);
      if (b.empty()) continue;
      ++times[m];
      by[m].insert(b.begin(), b.end());
    }
  int64_t worst = -1;
  size_t most = 0, second = 0;
  for (const int64_t m : epoch) {
    const size_t n = by[m].size();
    if (n > most) {
      second = most;
      most = n;
      worst = m;
    } else if (n > second) {
      second = n;
    }
  }
  // A tie (two members blaming each other) excludes nobody: the round's attempts are bounded.
  if (worst >= 0 && times[worst] == k && most > second)
    out.emplace_back(worst, "blamed by member(s) " + names(by[worst]) + " in " + std::to_string(k) +
                                " failed attempts of round " + std::to_string(round) + " in a row");
  return out;
}

Membership::JoinWait Membership::wait_for_join_roster(Roster& out, bool can_restart, int64_t step) {
  const auto t0 = SteadyClock::now();
  auto last_restart_check = t0;
  retry([&] { add_id(key("joiners"), id_); });
  for (;;) {
    bool found = false, done = false;
    retry([&] {
      const auto entries = redis_->lrange(key("rosters"), rosters_seen_, -1);
      for (const auto& e : entries) {
        ++rosters_seen_;
        // "[gG.]ROUND:ATTEMPT", pointing at a sealed roster; anything else is not the run's.
        std::string name = e;
        int64_t generation = 0, round = 0, attempt = 0;
        if (name.size() > 1 && name[0] == 'g') {
          const size_t dot = name.find('.');
          if (dot == std::string::npos || !parse_count(name.substr(1, dot - 1), generation)) continue;
          name = name.substr(dot + 1);
        }
        const size_t colon = name.find(':');
        if (colon == std::string::npos || !parse_count(name.substr(0, colon), round) ||
            !parse_count(name.substr(colon + 1), attempt))
          continue;
        std::string text;
        if (!get_sealed(*redis_, key("round:" + e + ":roster"), text)) continue;
        Roster r = read_roster(generation, round, attempt, text);
        if (contains(r.joiners, id_)) {
          out = r;
          generation_ = generation;
          found = true;
          return;
        }
      }
      std::string v;
      done = get_sealed(*redis_, key("finished"), v);
    });
    if (!found) check_not_excluded();
    if (found) return JoinWait::Joined;
    if (done) return JoinWait::Finished;
    if (can_restart && seconds_since(last_restart_check) > 0.25) {
      last_restart_check = SteadyClock::now();
      if (try_restart(step)) return JoinWait::Restarted;
    }
    if (seconds_since(t0) > opt_.start_timeout_s)
      fail("elastic: no member took this worker in within " + std::to_string(int(opt_.start_timeout_s)) +
           " s (elastic.start_timeout)");
    pause_ms(20);
  }
}

bool Membership::try_restart(int64_t step) {
  bool restarted = false;
  retry([&] {
    if (in_outage_grace()) return;  // heartbeats lapsed during an outage prove nothing
    // The generation first, then who is live: a joiner that restarted the run between the two
    // reads (still listed among the joiners) is found as the generation's live claimant, and
    // one that claims after this read makes this member's claim of the same generation fail.
    std::string g;
    int64_t gen = 0;
    if (get_sealed(*redis_, key("generation"), g) && !parse_count(g, gen)) gen = 0;
    std::string leader;
    int64_t lead = -1;
    if (gen > 0 && get_sealed(*redis_, key("restart:" + std::to_string(gen)), leader) && parse_count(leader, lead) &&
        lead != id_ && live(lead))
      return;  // the generation's restarter runs it: wait to be taken in
    const auto joiners = sealed_ids(*redis_, key("joiners"));
    const auto members = sealed_ids(*redis_, key("members"));
    for (const int64_t m : members)
      if (m != id_ && !contains(joiners, m) && live(m)) return;  // the run goes on: wait to be taken in
    const std::string claim = key("restart:" + std::to_string(gen + 1));
    if (!redis_->set_nx(claim, seal(claim, std::to_string(id_)))) return;  // another joiner restarts it
    // The previous generation's members are dropped: one that was only stalled rejoins this one.
    for (const int64_t m : members)
      if (m != id_ && !contains(joiners, m)) {
        const std::string dk = key("dropped:" + std::to_string(m));
        redis_->command({"SET", dk, seal(dk, "1")});
      }
    redis_->command({"SET", key("generation"), seal(key("generation"), std::to_string(gen + 1))});
    generation_ = gen + 1;
    restarted = true;
  });
  if (restarted) {
    retry([&] { redis_->command({"SREM", key("joiners"), seal(key("joiners"), std::to_string(id_))}); });
    retry([&] {
      log_event({{"event", "restarted"}, {"member", id_.load()}, {"step", step}, {"generation", generation_},
                 {"why", "no member of the run was live: it continues from this member's checkpoint"}});
    });
  }
  return restarted;
}

void Membership::leave_joiners() {
  retry([&] { redis_->command({"SREM", key("joiners"), seal(key("joiners"), std::to_string(id_))}); });
}

bool Membership::finish(const Roster& roster, bool ok) {
  const std::string rk = key("round:" + roster.key() + ":");
  const auto t0 = SteadyClock::now();
  const std::string ok_key = rk + "outcome";
  auto decide = [&](const char* outcome) {
    if (redis_->set_nx(ok_key, seal(ok_key, outcome))) expire_attempt_key(ok_key);
  };
  if (!ok) {  // no commit is possible without this member's vote
    retry([&] {
      std::string o;
      get_sealed(*redis_, ok_key, o);  // a forged outcome in the way is deleted
      decide("abort");
    });
    return false;
  }
  retry([&] { add_id(rk + "done", id_); });
  std::vector<int64_t> all = roster.contributors;
  all.insert(all.end(), roster.joiners.begin(), roster.joiners.end());
  std::map<int64_t, double> missing_since;
  for (;;) {
    std::string o;
    retry([&] {
      o.clear();
      if (get_sealed(*redis_, ok_key, o)) return;
      o.clear();
      const auto done = sealed_ids(*redis_, rk + "done");
      if (std::all_of(all.begin(), all.end(), [&](int64_t m) { return contains(done, m); })) {
        decide("commit");
        return;
      }
      if (in_outage_grace()) return;
      for (const int64_t m : all)
        if (!contains(done, m) && gone(m, missing_since)) decide("abort");
      if (seconds_since(t0) > opt_.straggler_timeout_s) decide("abort");
    });
    if (!o.empty()) return o == "commit";
    pause_ms(5);
  }
}

void Membership::mark_finished() {
  retry([&] { redis_->command({"SET", key("finished"), seal(key("finished"), "1")}); });
}

void Membership::log_event(const nlohmann::json& event) {
  nlohmann::json e = event;
  if (e.contains("member")) {
    const std::string m = std::to_string(e["member"].get<int64_t>());
    std::string info;
    if (get_sealed(*redis_, key("member:" + m), info)) {
      const auto j = nlohmann::json::parse(info, nullptr, false);
      if (j.is_object() && j.contains("name") && j["name"].is_string()) e["name"] = j["name"];
    }
  }
  e["time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  redis_->rpush(key("events"), seal(key("events"), e.dump()));
}

std::vector<nlohmann::json> Membership::new_events() {
  std::vector<nlohmann::json> out;
  std::set<std::string> fresh;  // the texts of `out`
  int64_t read = 0;
  retry([&] {
    out.clear();
    fresh.clear();
    read = 0;
    for (const auto& e : redis_->lrange(key("events"), events_seen_, -1)) {
      ++read;
      std::string text;
      if (!open(key("events"), e, text)) continue;
      // A genuine event pushed again (a replay needs no secret) counts once: every event logged
      // carries its time, so two alike are one.
      if (events_opened_.count(text) || fresh.count(text)) continue;
      auto j = nlohmann::json::parse(text, nullptr, false);
      if (j.is_object()) {
        out.push_back(std::move(j));
        fresh.insert(text);
      }
    }
  });
  events_seen_ += read;
  events_opened_.insert(fresh.begin(), fresh.end());
  return out;
}

}  // namespace loco
