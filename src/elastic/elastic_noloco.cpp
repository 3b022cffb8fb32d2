// NoLoCo over the elastic backend: every outer step k is a round among the live members of
// that moment (elastic/session.h). The groups are drawn among the round's contributors as
// NoLoCo draws them among replicas (noloco_groups with the round's count and the shared seed),
// and each member exchanges with its group only: its slow weights phi ("outer_weights") and its
// local progress ("outer_progress"), then takes the heavy-ball outer step of algo/noloco.h. With
// a fixed membership every member's numbers equal the in-process run's replica of the same
// rank. Unlike NoLoCo over MPI, the weights are sent in the round rather than overlapped with
// the inner steps, and the round's roster is a barrier among the live members (through the
// coordinator). A joiner receives the first contributor's slow weights and momentum and starts
// with its parameters equal to them.
#include <algorithm>
#include <iostream>

#include "algo/noloco.h"
#include "algo/robust.h"
#include "core/checksum.h"
#include "core/error.h"
#include "elastic/methods.h"
#include "elastic/session.h"

namespace loco {

namespace {

class ElasticNoloco : public ElasticMethod<Algorithm> {
 public:
  ElasticNoloco(const RunConfig& cfg, const Worker& w, const ElasticOptions& options,
                std::shared_ptr<TrafficStats> traffic, std::shared_ptr<TraceRecorder> trace)
      : ElasticMethod(cfg, w, options, std::move(traffic), std::move(trace)),
        cfg_(cfg.noloco),
        n_(int64_t(w.params.size())),
        phi_(w.params.size()),
        delta_(w.params.size(), 0.0f),
        screen_(aggregate_options(cfg.outer, true).screen),
        reject_norm_(cfg.outer.reject_norm) {}

  void start(Worker& w, bool resumed) override {
    if (!w.restored) phi_ = w.params;  // else from the checkpoint (load_state); a join replaces it
    session_.start(w, resumed, install());
  }

  bool rounds_at(const Worker&, int64_t done, bool last) const override {
    return done % cfg_.inner_steps == 0 || last;
  }

  void after_step(Worker& w, int64_t done, bool last) override {
    session_.count_step();
    const int64_t H = cfg_.inner_steps;
    if (!rounds_at(w, done, last)) return;
    const int64_t k = (done + H - 1) / H;
    std::vector<float> phi, delta;
    std::vector<float> theta(static_cast<size_t>(n_));
    // Received into by the round's communication thread: declared outside the round, so they
    // outlive its communicator when an attempt fails.
    std::vector<std::string> weights, progresses;
    ElasticSession::Round r;
    r.id = k;
    r.step = done;
    r.take_joiners = !last;
    r.reduce = [&](Communicator& comm, int rank, int size) {
      const auto group = noloco_group_of(size, cfg_.group_size, uint64_t(cfg_.seed), k, rank);
      std::vector<float> progress(static_cast<size_t>(n_));
      for (int64_t i = 0; i < n_; ++i) progress[size_t(i)] = w.params[size_t(i)] - phi_[size_t(i)];
      // Sends first, so that no member waits on another's receive.
      weights.assign(group.size(), std::string());
      progresses.assign(group.size(), std::string());
      std::vector<Communicator::Handle> handles;
      for (int m : group)  // send_start takes its payload by value: packed per partner, then moved
        if (m != rank) {
          handles.push_back(comm.send_start(m, noloco_to_bytes(phi_), "outer_weights"));
          handles.push_back(comm.send_start(m, noloco_to_bytes(progress), "outer_progress"));
        }
      for (size_t j = 0; j < group.size(); ++j)
        if (group[j] != rank) {
          handles.push_back(comm.recv_start(group[j], &weights[j], "outer_weights"));
          handles.push_back(comm.recv_start(group[j], &progresses[j], "outer_progress"));
        }
      for (auto& h : handles) comm.wait(h);
      std::vector<std::vector<float>> theirs_phi(group.size()), theirs_d(group.size());
      std::vector<const float*> phis(group.size()), ds(group.size());
      int self = 0;
      for (size_t j = 0; j < group.size(); ++j) {
        if (group[j] == rank) {
          self = int(j);
          phis[j] = phi_.data();
          ds[j] = progress.data();
          continue;
        }
        const std::string who = "member " + std::to_string(group[j]) + " of the round";
        theirs_phi[j] = noloco_from_bytes(weights[j], n_, who, "weights");
        theirs_d[j] = noloco_from_bytes(progresses[j], n_, who, "local progress");
        phis[j] = theirs_phi[j].data();
        ds[j] = theirs_d[j].data();
      }
      if (screen_) {
        const auto s = noloco_screen(phis, ds, self, n_, reject_norm_, cfg_.reject_distance);
        rejected_ = int(group.size() - s.kept.size());
        distance_ratio_ = s.distance_ratio;
        if (rejected_) std::cerr << "loco: warning: round " << k << ", left out: " << s.why << "\n";
        self = noloco_keep(s, self, phis, ds);
      }
      phi = phi_;
      delta = delta_;
      noloco_outer_step(phis, ds, self, phi.data(), delta.data(), theta.data(), n_, noloco_step_params(cfg_));
    };
    r.outer_state = [&](OuterState& s) {
      s.theta = phi;
      s.momentum = delta;
    };
    r.commit = [&] {
      phi_ = std::move(phi);
      delta_ = std::move(delta);
      w.params = theta;
      ++outer_steps_;
    };
    r.checksum = [&] { return crc32c(phi_.data(), phi_.size() * sizeof(float)); };
    session_.run_round(w, r, install());
    if (last) session_.finish_run();
  }

  void annotate(nlohmann::json& rec) override {
    ElasticMethod::annotate(rec);
    if (!screen_ || outer_steps_ == 0) return;
    rec["outer_rejected"] = rejected_;
    rec["partner_distance_ratio"] = distance_ratio_;
  }

  // Each member evaluates its own slow weights (on all validation windows).
  const std::vector<float>& eval_params(Worker&) override { return phi_; }
  void report(nlohmann::json& out) const override {
    out["outer_state_bytes"] = int64_t(phi_.size() + delta_.size()) * 4;
    out["noloco_outer_steps"] = outer_steps_;
    ElasticMethod::report(out);
  }

  void save_state(TrainingState& st) override {
    st.tensors["noloco.phi"] = phi_;
    st.tensors["noloco.delta"] = delta_;
  }
  void load_state(const TrainingState& st) override {
    st.take("noloco.phi", phi_);
    st.take("noloco.delta", delta_);
  }

 private:
  ElasticSession::Install install() {
    return [this](Worker& w, OuterState& s) {
      phi_ = std::move(s.theta);
      delta_ = std::move(s.momentum);
      w.params = phi_;
    };
  }

  NolocoConfig cfg_;
  int64_t n_;
  std::vector<float> phi_, delta_;
  int64_t outer_steps_ = 0;
  bool screen_;  // outer.screen (auto: on in elastic runs)
  double reject_norm_;
  int rejected_ = 0;           // partners left out of the last round
  double distance_ratio_ = 0;  // of the last round (noloco_screen)
};

}  // namespace

std::unique_ptr<Algorithm> make_elastic_noloco(const RunConfig& cfg, const Worker& w, const ElasticOptions& options,
                                               std::shared_ptr<TrafficStats> traffic,
                                               std::shared_ptr<TraceRecorder> trace) {
  return std::make_unique<ElasticNoloco>(cfg, w, options, std::move(traffic), std::move(trace));
}

}  // namespace loco
