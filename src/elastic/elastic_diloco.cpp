#include "elastic/elastic_diloco.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "elastic/gloo_transport.h"
#include "io/tensorboard.h"

namespace loco {

namespace {

// What a joiner receives from a live member: the outer state, the member's inner AdamW
// state, the step, the next round's membership and where its data starts; a JSON header, the
// tensors' floats, and a CRC-32C of everything before it.
struct JoinState {
  int64_t step = 0, data_epoch = 0, data_offset = 0, optimizer_steps = 0;
  std::vector<int64_t> epoch;
  std::vector<float> theta, momentum, m, v;
};

std::string encode(const JoinState& s) {
  const nlohmann::json head = {{"step", s.step},
                               {"data_epoch", s.data_epoch},
                               {"data_offset", s.data_offset},
                               {"optimizer_steps", s.optimizer_steps},
                               {"epoch", s.epoch},
                               {"floats", s.theta.size()}};
  const std::string h = head.dump();
  std::string out;
  const uint64_t hn = h.size();
  out.append(reinterpret_cast<const char*>(&hn), sizeof hn);
  out += h;
  for (const auto* t : {&s.theta, &s.momentum, &s.m, &s.v})
    out.append(reinterpret_cast<const char*>(t->data()), t->size() * sizeof(float));
  const uint32_t crc = crc32c(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(&crc), sizeof crc);
  return out;
}

JoinState decode(const std::string& bytes, size_t n_params, size_t n_trainable) {
  auto bad = [](const std::string& why) { fail("elastic: the state received from a peer is corrupt (" + why + ")"); };
  if (bytes.size() < 12) bad("too short");
  uint32_t crc;
  std::memcpy(&crc, bytes.data() + bytes.size() - 4, 4);
  if (crc32c(bytes.data(), bytes.size() - 4) != crc) bad("checksum mismatch");
  uint64_t hn;
  std::memcpy(&hn, bytes.data(), 8);
  if (hn > bytes.size() - 12) bad("header size");
  JoinState s;
  const auto head = nlohmann::json::parse(bytes.substr(8, hn));
  s.step = head.at("step");
  s.data_epoch = head.at("data_epoch");
  s.data_offset = head.at("data_offset");
  s.optimizer_steps = head.at("optimizer_steps");
  s.epoch = head.at("epoch").get<std::vector<int64_t>>();
  if (head.at("floats").get<size_t>() != n_params) bad("another model size");
  const size_t expect = 8 + hn + (2 * n_params + 2 * n_trainable) * sizeof(float) + 4;
  if (bytes.size() != expect) bad("size");
  const char* p = bytes.data() + 8 + hn;
  for (auto [t, n] : {std::pair{&s.theta, n_params}, {&s.momentum, n_params}, {&s.m, n_trainable}, {&s.v, n_trainable}}) {
    t->resize(n);
    std::memcpy(t->data(), p, n * sizeof(float));
    p += n * sizeof(float);
  }
  return s;
}

class ElasticDiloco : public Algorithm {
 public:
  ElasticDiloco(const RunConfig& cfg, const Worker& w, const ElasticOptions& options,
                std::shared_ptr<TrafficStats> traffic, std::shared_ptr<TraceRecorder> trace)
      : cfg_(cfg),
        outer_(cfg.outer),
        membership_(options),
        traffic_(std::move(traffic)),
        trace_(std::move(trace)),
        theta_(w.params.size()),
        momentum_(w.params.size(), 0.0f) {}

  // Before the run's clock starts: waiting here for the first quorum or to be taken in is not
  // part of the training loop's wall time.
  void start(Worker& w, bool resumed) override {
    theta_ = w.params;
    membership_.register_member();
    ids_.push_back(membership_.id());
    if (resumed) {
      // A resumed worker is a new member: the run went on without it.
      join(w, "resumed");
      return;
    }
    const Roster r = membership_.start_roster();
    const int slot = r.rank_of(membership_.id());
    if (slot < 0) {
      join(w, "started after the run began");
      return;
    }
    epoch_ = r.contributors;
    w.loader.assign(slot, int(epoch_.size()), 0, 0);
    last_round_step_ = 0;
  }

  void after_step(Worker& w, int64_t done, bool last) override {
    ++steps_trained_;
    if (done % outer_.inner_steps != 0 && !last) return;
    const auto t0 = std::chrono::steady_clock::now();
    const double compute_before = outer_compute_s_;
    sync(w, done, last);
    wait_s_ += seconds_since(t0) - (outer_compute_s_ - compute_before);
  }

  double wait_seconds() const override { return wait_s_; }

  int64_t continue_from(int64_t done) override {
    if (jump_to_ < 0) return done;
    const int64_t j = jump_to_;
    jump_to_ = -1;
    return j;
  }

  void annotate(nlohmann::json& rec) override {
    rec["members"] = epoch_.size();
    if (!pending_rounds_.empty()) rec["rounds"] = std::exchange(pending_rounds_, nlohmann::json::array());
    auto events = membership_.new_events();
    if (!events.empty()) {
      for (const auto& e : events) events_.push_back(e);
      rec["membership"] = events;
    }
  }

  const std::vector<float>& eval_params(Worker&) override { return theta_; }

  void report(nlohmann::json& out) const override {
    int64_t lost = 0;
    for (const auto& e : events_) lost += e.value("tokens_lost", int64_t(0));
    out["outer_state_bytes"] = int64_t(theta_.size() + momentum_.size()) * 4;
    out["elastic"] = {{"member_ids", ids_},
                      {"rounds", rounds_},
                      {"aborted_attempts", aborted_},
                      {"tokens_trained_here", steps_trained_ * int64_t(cfg_.data.batch_size) * cfg_.data.seq_len},
                      {"tokens_lost_run", lost},
                      {"run_finished_before_taken_in", missed_end_},
                      {"events", events_}};
  }

  void save_state(TrainingState& st) override {
    st.tensors["outer.params"] = theta_;
    st.tensors["outer.momentum"] = momentum_;
  }

 private:
  std::unique_ptr<Transport> connect(const Roster& r) {
    GlooTransportOptions o;
    o.address = membership_.options().address;
    o.timeout_s = membership_.options().timeout_s;
    return make_gloo_transport(membership_.redis(), membership_.key("gloo:" + r.key() + ":"),
                               r.rank_of(membership_.id()), r.size(), o);
  }
  CommOptions comm_options() const { return {membership_.options().timeout_s, 1.0}; }

  void sync(Worker& w, int64_t done, bool last) {
    const int64_t round = (done + outer_.inner_steps - 1) / outer_.inner_steps;
    const int64_t round_tokens = (done - last_round_step_) * int64_t(cfg_.data.batch_size) * cfg_.data.seq_len;
    const int64_t n = int64_t(theta_.size());
    for (int64_t attempt = 0;; ++attempt) {
      Roster roster;
      if (!membership_.close_roster(round, attempt, epoch_, last, round_tokens, roster)) {
        rejoin(w, "dropped at round " + std::to_string(round));
        return;
      }
      const int C = int(roster.contributors.size());
      const int me = roster.rank_of(membership_.id());
      std::vector<float> theta = theta_, momentum = momentum_, avg = w.params;
      std::string error;
      std::vector<int64_t> next_epoch = roster.contributors;
      next_epoch.insert(next_epoch.end(), roster.joiners.begin(), roster.joiners.end());
      std::sort(next_epoch.begin(), next_epoch.end());
      const DataLoader::Position next_data = w.loader.next_start();
      {
        std::shared_ptr<Transport> transport;
        std::unique_ptr<Communicator> comm;
        try {
          if (roster.size() > 1) {
            transport = connect(roster);
            comm = std::make_unique<Communicator>(transport, comm_options(), trace_, kDataChannel, traffic_);
            if (C > 1) {  // among the contributors (ranks 0..C-1); joiners only receive
              std::vector<int> members(static_cast<size_t>(C), 0);
              std::iota(members.begin(), members.end(), 0);
              auto h = comm->all_reduce_group_start(avg.data(), n, ReduceOp::Mean, members, "outer_gradients");
              comm->wait(h);
            }
          }
          const auto t_outer = std::chrono::steady_clock::now();
          outer_sgd_step(theta.data(), momentum.data(), avg.data(), n, outer_);
          outer_compute_s_ += seconds_since(t_outer);
          if (me == 0 && !roster.joiners.empty()) {
            JoinState s{done, next_data.epoch, next_data.offset, w.adamw.steps(), next_epoch, theta, momentum,
                        w.adamw.m(), w.adamw.v()};
            const std::string bytes = encode(s);
            std::vector<Communicator::Handle> sends;
            for (int j = C; j < roster.size(); ++j) sends.push_back(comm->send_start(j, bytes, "join_state"));
            for (auto& h : sends) comm->wait(h);
          }
        } catch (const std::exception& e) {
          error = e.what();
          if (transport) transport->abort(error);
        }
        if (comm) comm->shutdown();
        if (!error.empty()) note_abort(roster, error);
        if (!membership_.finish(roster, error.empty())) {
          ++aborted_;
          continue;
        }
      }
      theta_ = std::move(theta);
      momentum_ = std::move(momentum);
      w.params = theta_;
      rounds_.push_back({{"round", round}, {"step", done}, {"attempt", attempt}, {"contributors", roster.contributors},
                         {"joiners", roster.joiners},
                         {"params_crc32c", crc32c(theta_.data(), theta_.size() * sizeof(float))},
                         {"time", unix_time()}});
      pending_rounds_.push_back(rounds_.back());
      if (me == 0)
        for (const int64_t j : roster.joiners)
          membership_.log_event({{"event", "joined"}, {"member", j}, {"round", round}, {"step", done}, {"why", "joined"}});
      last_round_step_ = done;
      if (last) {
        membership_.mark_finished();
        return;
      }
      epoch_ = next_epoch;
      const int slot = int(std::find(epoch_.begin(), epoch_.end(), membership_.id()) - epoch_.begin());
      w.loader.assign(slot, int(epoch_.size()), next_data.epoch, next_data.offset);
      return;
    }
  }

  static double unix_time() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
  static double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  // A member whose part of an attempt failed says why in the membership log.
  void note_abort(const Roster& roster, const std::string& error) {
    try {
      membership_.log_event({{"event", "attempt_failed"}, {"member", membership_.id()}, {"round", roster.round},
                             {"attempt", roster.attempt}, {"why", error}});
    } catch (const std::exception&) {
      // the log is informative; the outcome vote that follows is what counts
    }
  }

  void rejoin(Worker& w, const std::string& why) {
    membership_.register_member();
    ids_.push_back(membership_.id());
    join(w, why);
  }

  // Waits for a roster that takes this member in, receives the state from its first member,
  // and continues from that round's step.
  void join(Worker& w, const std::string& why) {
    for (;;) {
      Roster roster;
      if (!membership_.wait_for_join_roster(roster)) {
        jump_to_ = cfg_.train.steps;  // the run finished before this worker got in
        missed_end_ = true;
        return;
      }
      JoinState s;
      std::string error, bytes;  // bytes outlives the communicator that writes into it
      {
        std::shared_ptr<Transport> transport;
        std::unique_ptr<Communicator> comm;
        try {
          transport = connect(roster);
          comm = std::make_unique<Communicator>(transport, comm_options(), trace_, kDataChannel, traffic_);
          auto h = comm->recv_start(0, &bytes, "join_state");
          comm->wait(h);
          s = decode(bytes, theta_.size(), w.adamw.m().size());
          if (std::find(s.epoch.begin(), s.epoch.end(), membership_.id()) == s.epoch.end())
            fail("elastic: the state received does not list this member");
        } catch (const std::exception& e) {
          error = e.what();
          if (transport) transport->abort(error);
        }
        if (comm) comm->shutdown();
        if (!error.empty()) note_abort(roster, error);
        if (!membership_.finish(roster, error.empty())) {
          ++aborted_;
          continue;
        }
      }
      theta_ = std::move(s.theta);
      momentum_ = std::move(s.momentum);
      w.params = theta_;
      w.adamw.m() = std::move(s.m);
      w.adamw.v() = std::move(s.v);
      w.adamw.set_steps(s.optimizer_steps);
      epoch_ = s.epoch;
      const int slot = int(std::find(epoch_.begin(), epoch_.end(), membership_.id()) - epoch_.begin());
      w.loader.assign(slot, int(epoch_.size()), s.data_epoch, s.data_offset);
      membership_.leave_joiners();
      last_round_step_ = s.step;
      jump_to_ = s.step;
      rounds_.push_back({{"round", roster.round}, {"step", s.step}, {"attempt", roster.attempt},
                         {"joined", why}, {"params_crc32c", crc32c(theta_.data(), theta_.size() * sizeof(float))},
                         {"time", unix_time()}});
      pending_rounds_.push_back(rounds_.back());
      return;
    }
  }

  const RunConfig& cfg_;
  OuterConfig outer_;
  Membership membership_;
  std::shared_ptr<TrafficStats> traffic_;
  std::shared_ptr<TraceRecorder> trace_;
  std::vector<float> theta_, momentum_;
  std::vector<int64_t> epoch_;  // this round's members (ids ascending); data slot = index
  std::vector<int64_t> ids_;    // every id this worker has held
  int64_t last_round_step_ = 0, jump_to_ = -1, steps_trained_ = 0, aborted_ = 0;
  bool missed_end_ = false;
  double wait_s_ = 0, outer_compute_s_ = 0;  // blocked in rounds and joins; outer steps (compute)
  nlohmann::json rounds_ = nlohmann::json::array(), pending_rounds_ = nlohmann::json::array();
  std::vector<nlohmann::json> events_;
};

}  // namespace

std::unique_ptr<Algorithm> make_elastic_diloco(const RunConfig& cfg, const Worker& w, const ElasticOptions& options,
                                               std::shared_ptr<TrafficStats> traffic,
                                               std::shared_ptr<TraceRecorder> trace) {
  return std::make_unique<ElasticDiloco>(cfg, w, options, std::move(traffic), std::move(trace));
}

}  // namespace loco
