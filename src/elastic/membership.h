#pragma once
// Membership of an elastic run, kept in Redis (keys "loco:RUN:..."). A member registers (a new
// id from a counter; ids are never reused) and is live while its heartbeat key, refreshed by a
// thread of its own, has not expired (TTL elastic.timeout). Each outer synchronization is a
// round r, tried in attempts a = 0, 1, ...: the members of the current epoch arrive, the
// roster is closed by whoever first sees every live member arrived (or the wait bound pass) and
// written once (SET NX), so that every member reads the same roster: the contributors (arrived
// and live) and the joiners waiting to be given the state. Members no longer in a roster are
// marked dropped: a dropped worker that comes back (stopped, then continued) learns it and
// rejoins as a new member. After the reduction every member of the roster records that it is
// done; the attempt commits when all have, and aborts (redone by the survivors as attempt a+1)
// if anyone fails, a member's heartbeat expires, or the bound passes; the outcome is also
// written once, so no member applies a round the others discard.
// Every entry the run relies on (member records, heartbeats, the sets of ids, rosters, outcomes,
// exclusions, drops, events) carries a MAC under the run key bound to its Redis key (a value as
// VALUE "\n" MAC, a set element as ID "\n" MAC), so an entry written by anyone without the run
// secret, or moved from another key, is ignored with a warning; a forged entry in a write-once
// key (a roster, an outcome) is deleted, if it is still the one read, so the honest one can be
// written. What a Redis writer can still do: delete entries (members then look dead or the run
// lost, and stop or are dropped: denial of service), and write back a heartbeat it saw earlier
// (keeping a dead member "live" until elastic.straggler_timeout drops it).
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/link.h"
#include "comm/fault.h"
#include "elastic/redis.h"
#include "elastic/secure_channel.h"

namespace loco {

// A worker whose model loco does not hold (the Python layer): the caller owns the inner
// optimizer and the data, so a joiner receives the inner optimizer's state as the bytes
// `save_inner` gave on the sending member (installed by `load_inner`), and the worker learns its
// share of the data (its slot among the round's members) from `assign_data`. The members that
// start the run take the first one's parameters (their models may have been initialized apart).
struct ForeignWorker {
  std::function<std::string()> save_inner;
  std::function<void(const std::string&)> load_inner;
  std::function<void(int slot, int members)> assign_data;
};

struct ElasticOptions {
  JoinAddress where;
  std::string password;
  Key run_key{};              // from the run secret: authenticates the data plane and Redis entries
  std::string fingerprint;    // what the members must agree on (elastic/fingerprint.h), as JSON
  Fault fault;                // elastic.fault (comm/fault.h)
  std::string name;           // the worker's name (--worker), for the membership log
  std::string address;        // where peers reach this worker's data plane
  int min_workers = 1;        // the first round waits for this many members
  double timeout_s = 5;       // heartbeat TTL; longest wait on a peer during a sync
  double start_timeout_s = 300;       // waiting for the first quorum, or for a joiner's state
  double coordinator_timeout_s = 60;  // retrying while Redis is unreachable
  double straggler_timeout_s = 60;    // waiting for a live member to arrive at a round
  int exclude_after = 3;              // elastic.exclude_after
  LinkConfig link;                    // the link model (network.*) over the data plane
  std::shared_ptr<ForeignWorker> foreign;  // set for a model loco does not hold
  int slice = -1;  // partial updates: the slice a worker resumed from its checkpoint trains (-1: from its id)
};

// "ROUND:ATTEMPT", or "gG.ROUND:ATTEMPT" in generation G > 0 (a run restarted after all its
// workers died: each restart has keys of its own, so the dead rounds' entries cannot interfere).
std::string attempt_name(int64_t generation, int64_t round, int64_t attempt);

struct Roster {
  int64_t generation = 0, round = 0, attempt = 0;
  std::vector<int64_t> contributors, joiners;  // ids, ascending
  int size() const { return int(contributors.size() + joiners.size()); }
  // Rank in the attempt's transport: contributors first, then joiners; -1 if not in it.
  int rank_of(int64_t id) const;
  std::string tag;  // a keyed digest of the roster's text (Membership sets it)
  std::string key() const { return attempt_name(generation, round, attempt); }
  // The attempt's transport: members holding different rosters for one attempt (possible only
  // if someone deleted a roster that members had read) derive different keys and cannot connect.
  std::string transport_name() const { return key() + (tag.empty() ? "" : ":" + tag); }
  nlohmann::json to_json() const;
  static Roster from_json(int64_t round, int64_t attempt, const std::string& text);
};

class Membership {
 public:
  explicit Membership(ElasticOptions options);
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  const ElasticOptions& options() const { return opt_; }
  int64_t id() const { return id_; }
  Redis& redis() { return *redis_; }
  std::string key(const std::string& suffix) const { return prefix_ + suffix; }

  // Registers as a new member (a new id) and starts heartbeating; a worker that was dropped
  // calls it again to rejoin. First compares this worker's fingerprint with the run's (the
  // first member's, published with a MAC) and fails, naming the differing keys, on a mismatch.
  void register_member();

  // Round 0 (before training): arrives at the start and returns its roster (contributors:
  // the members that start the run). Waits for elastic.min_workers. In a restarted run, an
  // empty roster (the worker joins).
  Roster start_roster();
  // Arrives at round r's attempt a as a member of `epoch` and reads the attempt's roster into
  // `out`; false if this member is not a contributor in it (it was dropped).
  // Members missing from it are logged as having lost `round_tokens` tokens of work each.
  bool close_roster(int64_t round, int64_t attempt, const std::vector<int64_t>& epoch, bool last_round,
                    int64_t round_tokens, Roster& out);
  // Waits, as a joiner, for a roster that names this member among its joiners (polls the log
  // of rosters). Bounded by elastic.start_timeout. With `can_restart` (this worker restored a
  // checkpoint), once no member but waiting joiners is live (every worker of the run died), it
  // tries to restart the run: the first such joiner to claim the next generation (SET NX) marks
  // the previous members dropped and continues the run alone from its checkpoint; the others
  // wait on and are taken in at its next round.
  enum class JoinWait { Joined, Finished, Restarted };
  JoinWait wait_for_join_roster(Roster& out, bool can_restart = false, int64_t step = 0);
  // After a committed join: no longer waiting.
  void leave_joiners();
  // Votes: done (ok) or failed; returns true if the attempt committed.
  bool finish(const Roster& roster, bool ok);
  // Records, before voting failed, the members this one holds responsible for the attempt's
  // failure (the peers its transport names). The closer of the next attempt decides from the
  // blames who is excluded (close_roster).
  void blame(const Roster& roster, const std::vector<int64_t>& culprits);
  // The run's last round committed: joiners still waiting give up.
  void mark_finished();

  // Membership events (who joined or left, at which round and why), shared by all members.
  void log_event(const nlohmann::json& event);
  // The events logged since the previous call (for this worker's metrics).
  std::vector<nlohmann::json> new_events();

 private:
  // Runs `fn` (Redis commands), retrying while the coordinator is unreachable, at most
  // elastic.coordinator_timeout; then fails with a clear message.
  void retry(const std::function<void()>& fn);
  // Heartbeat present and not dropped (for taking a member in).
  bool live(int64_t id);
  bool dropped(Redis& redis, int64_t id);
  // The keys of round r's attempt a in the current generation ("loco:RUN:round:NAME:").
  std::string round_key(int64_t round, int64_t attempt) const {
    return key("round:" + attempt_name(generation_, round, attempt) + ":");
  }
  // wait_for_join_roster's restart (above); true if this member now leads generation + 1.
  bool try_restart(int64_t step);
  // Dropped, or its heartbeat missing in every check over elastic.timeout / 4 while the
  // coordinator answered promptly (for dropping a member). `missing_since` is the caller's record
  // of when each member was first seen missing, kept for one wait: a heartbeat that expired
  // while Redis was stopped is missing only until the member's next beat, and the stall that
  // proves the outage may be seen by this member's heartbeat thread a moment later.
  bool gone(int64_t id, std::map<int64_t, double>& missing_since);
  static double now_s();
  // Within elastic.timeout of the end of an outage of the coordinator (seen by the main thread
  // or the heartbeat): expired heartbeats may be the outage's, so nobody is dropped for them.
  bool in_outage_grace() const;
  // After an outage: starts the grace period; false (and every later Redis call of this member
  // fails) if the coordinator has forgotten the run.
  bool outage_over(Redis& redis);
  void check_state();
  void check_fingerprint();
  // Fails with the reason if this member was excluded from the run (or refused as a joiner).
  void check_not_excluded();
  // The joiners whose member record carries another fingerprint than this member's (or none):
  // refused, the differences named, even when the run's config entry in Redis was removed or
  // replaced since they registered (it is written again here).
  std::vector<std::pair<int64_t, std::string>> joiner_refusals(const std::vector<int64_t>& joiners);
  // Who the closer of attempt `attempt` of `round` excludes (member -> reason): joiners blamed
  // in the previous attempt, and the member of `epoch` blamed in each of the last
  // exclude_after attempts by more distinct members than any other.
  std::vector<std::pair<int64_t, std::string>> exclusions(int64_t round, int64_t attempt,
                                                          const std::vector<int64_t>& epoch,
                                                          const std::vector<int64_t>& joiners);
  std::atomic<bool> state_lost_{false};
  // Arrives at the attempt whose keys start with `rk` and polls until its roster is written,
  // calling `try_close` (which may write it) in between; returns the roster's text. Fails with
  // `bound_message` after `bound_s` seconds.
  std::string await_roster(const std::string& rk, double bound_s, const std::string& bound_message,
                           const std::function<void()>& try_close);
  void heartbeat_loop();
  void beat();
  // Sealing (above): the entry for `value` at key `k`.
  std::string seal(const std::string& k, const std::string& value) const;
  // The value of `entry` read at key `k`, or false with a warning when it does not carry this
  // run's MAC for that key.
  bool open(const std::string& k, const std::string& entry, std::string& value);
  // GET of a sealed entry: false when absent or not sealed by the run (a forged entry is then
  // deleted if it is still the one read).
  bool get_sealed(Redis& redis, const std::string& k, std::string& value);
  // The ids in a set of sealed ids, ascending (forged or malformed elements ignored); adding one.
  std::vector<int64_t> sealed_ids(Redis& redis, const std::string& set_key);
  void add_id(const std::string& set_key, int64_t id);
  // Keys of a round's attempt (but round 0's) are deleted by Redis 6 hours after their last write.
  void expire_attempt_key(const std::string& k);
  Roster read_roster(int64_t generation, int64_t round, int64_t attempt, const std::string& text) const;
  std::atomic<int> warnings_{0};

  ElasticOptions opt_;
  std::string prefix_;
  std::unique_ptr<Redis> redis_, beat_redis_;  // the heartbeat thread has its own connection
  std::atomic<int64_t> id_{-1};
  std::mutex beat_mu_;
  std::condition_variable beat_cv_;
  bool stop_ = false;
  std::thread beat_thread_;
  std::atomic<double> outage_end_s_{-1e300};
  int64_t events_seen_ = 0;
  std::set<std::string> events_opened_;  // the events read so far (replays of them are skipped)
  int64_t rosters_seen_ = 0;
  int64_t generation_ = 0;  // of the rounds this member takes part in
};

}  // namespace loco
