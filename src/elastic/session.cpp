#include "elastic/session.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "algo/partial.h"
#include "comm/inprocess.h"
#include "core/checksum.h"
#include "core/error.h"
#include "elastic/join_state.h"
#include "elastic/methods.h"
#include "elastic/secure_transport.h"

namespace loco {

namespace {

double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

ElasticSession::ElasticSession(const RunConfig& cfg, const ElasticOptions& options,
                               std::shared_ptr<TrafficStats> traffic, std::shared_ptr<TraceRecorder> trace,
                               size_t num_params)
    : cfg_(cfg),
      membership_(options),
      traffic_(std::move(traffic)),
      trace_(std::move(trace)),
      num_params_(num_params) {}

void ElasticSession::register_worker(Worker& w) {
  membership_.register_member();
  ids_.push_back(membership_.id());
  const int resumed = membership_.options().slice;
  if (cfg_.partial.slices > 1) w.set_slice(resumed >= 0 ? resumed : int((membership_.id() - 1) % cfg_.partial.slices));
}

// Before the run's clock starts: waiting here for the first quorum or to be taken in is not
// part of the training loop's wall time.
void ElasticSession::start(Worker& w, bool resumed, const Install& install) {
  if (ids_.empty()) register_worker(w);
  if (resumed) {
    // A resumed worker is a new member: the run went on without it. If every worker of the run
    // died, one restored from a checkpoint restarts the run from it instead (Membership).
    join(w, "resumed", install, w.restored);
    return;
  }
  const Roster r = membership_.start_roster();
  const int slot = r.rank_of(membership_.id());
  if (slot < 0) {
    join(w, "started after the run began", install);
    return;
  }
  epoch_ = r.contributors;
  assign_data(w, {});
  last_round_step_ = 0;
  if (membership_.options().foreign && epoch_.size() > 1) equalize_start(w, r, install);
}

void ElasticSession::equalize_start(Worker& w, const Roster& r, const Install& install) {
  const int me = r.rank_of(membership_.id()), C = int(r.contributors.size());
  std::string bytes, error;  // bytes outlives the communicator that writes into it
  {
    std::shared_ptr<Transport> transport;
    std::unique_ptr<Communicator> comm;
    try {
      transport = connect(r.transport_name() + ":start", me, C);
      comm = std::make_unique<Communicator>(transport, comm_options(), trace_, kDataChannel, traffic_);
      if (me == 0) bytes.assign(reinterpret_cast<const char*>(w.params.data()), w.params.size() * sizeof(float));
      auto h = comm->broadcast_start(&bytes, 0, "start_params");
      comm->wait(h);
      if (bytes.size() != num_params_ * sizeof(float))
        fail("elastic: the first member sent " + std::to_string(bytes.size()) + " bytes of parameters, expected " +
             std::to_string(num_params_ * sizeof(float)));
    } catch (const std::exception& e) {
      error = e.what();
      if (transport) transport->abort(error);
    }
    if (comm) comm->shutdown();
  }
  if (me == 0) return;  // its parameters are the run's, whoever received them
  if (!error.empty()) {
    // Without the first member's parameters this one cannot contribute: it joins as a new
    // member, taking the state of a round's first contributor.
    rejoin(w, "the run's starting parameters did not arrive (" + error + ")", install);
    return;
  }
  JoinState s;
  s.outer.theta.resize(num_params_);
  std::memcpy(s.outer.theta.data(), bytes.data(), bytes.size());
  s.outer.momentum.assign(num_params_, 0.0f);
  s.outer.norm_history.resize(norm_histories_);  // no round yet
  install(w, s.outer);
}

std::unique_ptr<Transport> ElasticSession::connect(const std::string& name, int rank, int size) {
  if (size == 1) return std::move(make_inprocess_transports(1)[0]);
  SecureTransportOptions o;
  o.address = membership_.options().address;
  o.timeout_s = membership_.options().timeout_s;
  auto book = redis_address_book(membership_.redis());
  auto t = make_secure_transport(*book, membership_.key("net:" + name + ":"),
                                 membership_.options().run_key, name, rank, size, o);
  // Each worker's link is modelled per transport: a round's context starts with its link idle
  // (the previous round's transfers have ended) and, with network.tcp, new connections.
  const auto& link = membership_.options().link;
  return link.enabled() ? wrap_with_link(std::move(t), link, real_clock()) : std::move(t);
}

CommOptions ElasticSession::comm_options() const { return {membership_.options().timeout_s, 1.0}; }

void ElasticSession::assign_data(Worker& w, const DataLoader::Position& at) {
  const int slot = int(std::find(epoch_.begin(), epoch_.end(), membership_.id()) - epoch_.begin());
  if (w.loader) w.loader->assign(slot, int(epoch_.size()), at.epoch, at.offset);
  if (const auto& f = membership_.options().foreign) f->assign_data(slot, int(epoch_.size()));
}

bool ElasticSession::run_round(Worker& w, const Round& round, const Install& install) {
  const auto t0 = std::chrono::steady_clock::now();
  const double compute_before = round_compute_s_;
  const int64_t round_tokens =
      (round.step - last_round_step_) * int64_t(cfg_.data.batch_size) * cfg_.data.seq_len;
  bool committed = false;
  std::string last_error;
  for (int64_t attempt = 0;; ++attempt) {
    if (attempt >= kMaxAttempts)
      fail("elastic: round " + std::to_string(round.id) + " failed " + std::to_string(kMaxAttempts) +
           " attempts in a row without a member to exclude; the last error: " + last_error);
    Roster roster;
    if (!membership_.close_roster(round.id, attempt, epoch_, !round.take_joiners, round_tokens, roster)) {
      rejoin(w, "dropped at round " + std::to_string(round.id), install);
      break;
    }
    const int C = int(roster.contributors.size());
    const int me = roster.rank_of(membership_.id());
    std::vector<int64_t> next_epoch = roster.contributors;
    next_epoch.insert(next_epoch.end(), roster.joiners.begin(), roster.joiners.end());
    std::sort(next_epoch.begin(), next_epoch.end());
    const DataLoader::Position next_data = w.loader ? w.loader->next_start() : DataLoader::Position{};
    std::string error;
    std::vector<int64_t> blamed;  // members this one holds responsible for a failure
    {
      // Declared before the communicators, which write into it and are shut down first.
      std::string state;
      std::vector<std::string> inbox, asked;  // partial updates: slices' optimizer states; joiners' slices
      bool joining = false;
      std::shared_ptr<Transport> transport, join_transport;
      std::unique_ptr<Communicator> comm, join_comm;
      try {
        transport = connect(roster.transport_name(), me, C);
        comm = std::make_unique<Communicator>(transport, comm_options(), trace_, kDataChannel, traffic_);
        round.reduce(*comm, me, C);
        const bool sliced = cfg_.partial.slices > 1;
        slice_state_crc_ = -1;
        std::vector<std::string> by_slice;
        if (sliced && !roster.joiners.empty()) {
          inbox.assign(size_t(C), std::string());
          by_slice = slice_states(w, *comm, me, C, inbox);
        }
        // The joiners' transport: the first contributor (rank 0) and the joiners (1, 2, ...).
        if (me == 0 && !roster.joiners.empty()) {
          JoinState s{round.step, next_data.epoch, next_data.offset, 0, next_epoch, {}, {}, {}, {}};
          const auto t_outer = std::chrono::steady_clock::now();
          round.outer_state(s.outer);
          round_compute_s_ += seconds_since(t_outer);
          const int J = int(roster.joiners.size());
          joining = true;
          join_transport = connect(roster.transport_name() + ":join", 0, 1 + J);
          join_comm = std::make_unique<Communicator>(join_transport, comm_options(), trace_, kDataChannel, traffic_);
          std::vector<int> slice_of(size_t(J), -1);
          if (sliced) {  // each joiner first says which slice it trains
            asked.assign(size_t(J), std::string());
            std::vector<Communicator::Handle> recvs;
            for (int j = 1; j <= J; ++j) recvs.push_back(join_comm->recv_start(j, &asked[size_t(j - 1)], "join_slice"));
            for (auto& h : recvs) join_comm->wait(h);
            for (int j = 1; j <= J; ++j) {
              slice_of[size_t(j - 1)] = parse_slice(asked[size_t(j - 1)], cfg_.partial.slices);
              if (slice_of[size_t(j - 1)] < 0)
                throw PeerError("elastic: joiner " + std::to_string(roster.joiners[size_t(j - 1)]) +
                                    " named no valid slice",
                                {j});
            }
          }
          // One encoded state at a time (a model's outer state each): the joiners of one slice,
          // then those of the next.
          for (int n = sliced ? 0 : -1; n < (sliced ? cfg_.partial.slices : 0); ++n) {
            std::vector<Communicator::Handle> sends;
            for (int j = 1; j <= J; ++j) {
              if (slice_of[size_t(j - 1)] != n) continue;
              if (sends.empty()) {
                set_optimizer_state(w, s, n, by_slice);
                state = encode_join_state(s);
              }
              sends.push_back(join_comm->send_start(j, state, "join_state"));
            }
            for (auto& h : sends) join_comm->wait(h);
          }
        }
      } catch (const PeerError& e) {
        error = e.what();
        // Ranks of the reduction's transport are contributors; of the joiners', 0 is this member
        // and j the joiner j - 1.
        for (const int r : e.peers())
          if (!joining && r >= 0 && r < C)
            blamed.push_back(roster.contributors[size_t(r)]);
          else if (joining && r >= 1 && r <= int(roster.joiners.size()))
            blamed.push_back(roster.joiners[size_t(r - 1)]);
      } catch (const std::exception& e) {
        error = e.what();
      }
      if (!error.empty()) {
        if (transport) transport->abort(error);
        if (join_transport) join_transport->abort(error);
      }
      if (join_comm) join_comm->shutdown();
      if (comm) comm->shutdown();
      if (!error.empty()) {
        note_abort(roster, error, blamed);
        last_error = error;
      }
      if (!membership_.finish(roster, error.empty())) {
        ++aborted_;
        continue;
      }
    }
    round.commit();
    const uint32_t crc = round.checksum();
    rounds_.push_back({{"round", round.id}, {"step", round.step}, {"attempt", attempt},
                       {"contributors", roster.contributors}, {"joiners", roster.joiners},
                       {"params_crc32c", crc}, {"time", unix_time()}});
    if (cfg_.partial.slices > 1) rounds_.back()["slice"] = w.slice;
    if (slice_state_crc_ >= 0) rounds_.back()["slice_state_crc32c"] = slice_state_crc_;  // handed to a joiner
    pending_rounds_.push_back(rounds_.back());
    if (me == 0)
      for (const int64_t j : roster.joiners)
        membership_.log_event(
            {{"event", "joined"}, {"member", j}, {"round", round.id}, {"step", round.step}, {"why", "joined"}});
    last_round_step_ = round.step;
    epoch_ = next_epoch;
    assign_data(w, next_data);
    committed = true;
    break;
  }
  wait_s_ += seconds_since(t0) - (round_compute_s_ - compute_before);
  return committed;
}

void ElasticSession::finish_run() { membership_.mark_finished(); }

int64_t ElasticSession::continue_from(int64_t done) {
  if (jump_to_ < 0) return done;
  const int64_t j = jump_to_;
  jump_to_ = -1;
  return j;
}

void ElasticSession::annotate(nlohmann::json& rec) {
  rec["members"] = epoch_.size();
  if (!pending_rounds_.empty()) rec["rounds"] = std::exchange(pending_rounds_, nlohmann::json::array());
  auto events = membership_.new_events();
  if (!events.empty()) {
    for (const auto& e : events) events_.push_back(e);
    rec["membership"] = events;
  }
}

void ElasticSession::report(nlohmann::json& out) const {
  int64_t lost = 0;
  for (const auto& e : events_) lost += e.value("tokens_lost", int64_t(0));
  out["elastic"] = {{"member_ids", ids_},
                    {"rounds", rounds_},
                    {"aborted_attempts", aborted_},
                    {"tokens_trained_here", steps_trained_ * int64_t(cfg_.data.batch_size) * cfg_.data.seq_len},
                    {"tokens_lost_run", lost},
                    {"run_finished_before_taken_in", missed_end_},
                    {"events", events_}};
}

// A member whose part of an attempt failed says why in the membership log, and whom it blames.
void ElasticSession::note_abort(const Roster& roster, const std::string& error, const std::vector<int64_t>& blamed) {
  try {
    membership_.blame(roster, blamed);
    membership_.log_event({{"event", "attempt_failed"}, {"member", membership_.id()}, {"round", roster.round},
                           {"attempt", roster.attempt}, {"blamed", blamed}, {"why", error}});
  } catch (const std::exception&) {
    // the log is informative; the outcome vote that follows is what counts
  }
}

void ElasticSession::rejoin(Worker& w, const std::string& why, const Install& install) {
  membership_.register_member();
  ids_.push_back(membership_.id());
  join(w, why, install);
}

// Waits for a roster that takes this member in, receives the state from its first
// contributor, and continues from that round's step.
void ElasticSession::join(Worker& w, const std::string& why, const Install& install, bool can_restart) {
  for (;;) {
    Roster roster;
    const int64_t step = w.adamw ? w.adamw->steps() : w.step;
    const auto waited = membership_.wait_for_join_roster(roster, can_restart, step);
    if (waited == Membership::JoinWait::Finished) {
      jump_to_ = cfg_.train.steps;  // the run finished before this worker got in
      missed_end_ = true;
      return;
    }
    if (waited == Membership::JoinWait::Restarted) {
      // Alone, from this worker's checkpoint; whoever joins is taken in at the next round.
      std::fprintf(stderr,
                   "loco: elastic: no member of the run is live; restarting it from this worker's checkpoint at step "
                   "%lld (others that join are taken in at its next round)\n",
                   static_cast<long long>(step));
      epoch_ = {membership_.id()};
      last_round_step_ = step;
      rounds_.push_back({{"step", step}, {"restarted", "no member of the run was live"}, {"time", unix_time()}});
      pending_rounds_.push_back(rounds_.back());
      return;
    }
    const auto& js = roster.joiners;
    const int rank = 1 + int(std::find(js.begin(), js.end(), membership_.id()) - js.begin());
    JoinState s;
    std::string error, bytes;  // bytes outlives the communicator that writes into it
    {
      std::shared_ptr<Transport> transport;
      std::unique_ptr<Communicator> comm;
      try {
        transport = connect(roster.transport_name() + ":join", rank, 1 + int(js.size()));
        comm = std::make_unique<Communicator>(transport, comm_options(), trace_, kDataChannel, traffic_);
        if (cfg_.partial.slices > 1) {  // the slice this worker trains, for the optimizer state of it
          const int32_t n = w.slice;
          auto hs = comm->send_start(0, std::string(reinterpret_cast<const char*>(&n), sizeof n), "join_slice");
          comm->wait(hs);
        }
        auto h = comm->recv_start(0, &bytes, "join_state");
        comm->wait(h);
        s = decode_join_state(bytes, num_params_, w.adamw ? w.adamw->m().size() : 0, norm_histories_);
        if (std::find(s.epoch.begin(), s.epoch.end(), membership_.id()) == s.epoch.end())
          fail("elastic: the state received does not list this member");
        if (s.has_optimizer && s.slice != (cfg_.partial.slices > 1 ? w.slice : -1))
          fail("elastic: the state received carries the optimizer state of slice " + std::to_string(s.slice) +
               "; this worker trains " + (cfg_.partial.slices > 1 ? "slice " + std::to_string(w.slice) : "no slices"));
      } catch (const std::exception& e) {
        error = e.what();
        if (transport) transport->abort(error);
      }
      if (comm) comm->shutdown();
      // A joiner blames nobody: when its transfer fails, the contributors' blame decides.
      if (!error.empty()) note_abort(roster, error, {});
      if (!membership_.finish(roster, error.empty())) {
        ++aborted_;
        continue;
      }
    }
    // Without the state of its slice (nobody in the round trains it) a worker keeps its own:
    // fresh moments for a new one.
    if (s.has_optimizer && w.adamw) {
      w.adamw->m() = std::move(s.m);
      w.adamw->v() = std::move(s.v);
      w.adamw->set_steps(s.optimizer_steps);
    } else if (s.has_optimizer) {
      membership_.options().foreign->load_inner(s.inner);
    }
    install(w, s.outer);
    const uint32_t crc = crc32c(w.params.data(), w.params.size() * sizeof(float));
    epoch_ = s.epoch;
    assign_data(w, {s.data_epoch, 0, s.data_offset});
    membership_.leave_joiners();
    last_round_step_ = s.step;
    jump_to_ = s.step;
    rounds_.push_back({{"round", roster.round}, {"step", s.step}, {"attempt", roster.attempt}, {"joined", why},
                       {"params_crc32c", crc}, {"time", unix_time()}});
    if (cfg_.partial.slices > 1) {  // the optimizer state of this worker's slice: received, or its own kept
      rounds_.back()["slice"] = w.slice;
      rounds_.back()["optimizer"] = s.has_optimizer ? "received" : "kept";
      const std::string state = w.adamw ? inner_state(w) : s.inner;  // as the member that handed it over computed it
      if (w.adamw || s.has_optimizer) rounds_.back()["optimizer_crc32c"] = crc32c(state.data(), state.size());
    }
    pending_rounds_.push_back(rounds_.back());
    return;
  }
}

std::vector<std::string> ElasticSession::slice_states(Worker& w, Communicator& comm, int me, int C,
                                                     std::vector<std::string>& inbox) {
  std::vector<std::string> got;
  const int32_t mine = w.slice;
  auto h = comm.all_gather_direct_start(std::string(reinterpret_cast<const char*>(&mine), sizeof mine), &got,
                                        "partial_slices");
  comm.wait(h);
  const int N = cfg_.partial.slices;
  std::vector<int> holder(size_t(N), -1);  // each slice's first trainer among the contributors
  for (int m = 0; m < C; ++m) {
    const int n = parse_slice(got[size_t(m)], N);
    if (n < 0) throw PeerError("elastic: contributor " + std::to_string(m) + " named no valid slice", {m});
    if (holder[size_t(n)] < 0) holder[size_t(n)] = m;
  }
  std::vector<std::string> by_slice(static_cast<size_t>(N));
  std::vector<Communicator::Handle> ops;
  for (int n = 0; n < N; ++n) {
    const int k = holder[size_t(n)];
    if (k == me) {  // the state this member hands over, and its checksum for the round's record
      std::string state = std::string(1, 'S').append(inner_state(w));
      slice_state_crc_ = crc32c(state.data() + 1, state.size() - 1);
      if (me == 0) by_slice[size_t(n)] = std::move(state);
      else ops.push_back(comm.send_start(0, std::move(state), "slice_state"));
    } else if (k > 0 && me == 0) {
      ops.push_back(comm.recv_start(k, &inbox[size_t(k)], "slice_state"));
    }
  }
  for (auto& op : ops) comm.wait(op);
  if (me != 0) return {};
  for (int n = 0; n < N; ++n) {
    const int k = holder[size_t(n)];
    if (k <= 0) continue;
    if (inbox[size_t(k)].empty() || inbox[size_t(k)][0] != 'S')
      throw PeerError("elastic: contributor " + std::to_string(k) + " sent a malformed optimizer state", {k});
    by_slice[size_t(n)] = std::move(inbox[size_t(k)]);
  }
  return by_slice;
}

std::string ElasticSession::inner_state(Worker& w) {
  if (!w.adamw) return membership_.options().foreign->save_inner();
  const auto& m = w.adamw->m();
  const auto& v = w.adamw->v();
  const int64_t steps = w.adamw->steps();
  std::string out(reinterpret_cast<const char*>(&steps), sizeof steps);
  out.append(reinterpret_cast<const char*>(m.data()), m.size() * sizeof(float));
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  return out;
}

void ElasticSession::set_optimizer_state(Worker& w, JoinState& s, int slice, const std::vector<std::string>& by_slice) {
  s.m.clear();
  s.v.clear();
  s.inner.clear();
  s.optimizer_steps = 0;
  s.slice = slice;
  s.has_optimizer = true;
  std::string bytes;
  if (slice < 0) {
    bytes = inner_state(w);
  } else {
    s.has_optimizer = !by_slice[size_t(slice)].empty();
    if (!s.has_optimizer) return;
    bytes = by_slice[size_t(slice)].substr(1);
  }
  if (!w.adamw) {
    s.inner = std::move(bytes);
    return;
  }
  const size_t n = w.adamw->m().size();
  if (bytes.size() != sizeof(int64_t) + 2 * n * sizeof(float))
    fail("elastic: a contributor's optimizer state for slice " + std::to_string(slice) + " holds " +
         std::to_string(bytes.size()) + " bytes, expected " + std::to_string(sizeof(int64_t) + 2 * n * sizeof(float)));
  std::memcpy(&s.optimizer_steps, bytes.data(), sizeof(int64_t));
  s.m.resize(n);
  s.v.resize(n);
  std::memcpy(s.m.data(), bytes.data() + sizeof(int64_t), n * sizeof(float));
  std::memcpy(s.v.data(), bytes.data() + sizeof(int64_t) + n * sizeof(float), n * sizeof(float));
}

std::unique_ptr<Algorithm> make_elastic_algorithm(const RunConfig& cfg, Worker& w, const ElasticOptions& options,
                                                  std::shared_ptr<TrafficStats> traffic,
                                                  std::shared_ptr<TraceRecorder> trace) {
  auto session = std::make_unique<ElasticSession>(cfg, options, std::move(traffic), std::move(trace), w.params.size());
  session->register_worker(w);  // with partial updates, the slice the method is made for
  switch (cfg.method()) {
    case MethodId::Diloco: return make_diloco(cfg, w, std::move(session), options.fault);
    case MethodId::Streaming: return make_streaming(cfg, w, std::move(session), options.fault);
    case MethodId::Noloco: return make_noloco(cfg, w, std::move(session));
    case MethodId::Ddp: break;  // refused before (elastic_refusal)
  }
  fail("internal: algorithm = \"" + cfg.algorithm + "\" has no elastic form");
}

}  // namespace loco
