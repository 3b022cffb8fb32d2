// NoLoCo (docs/noloco.md), the outer step: every H inner steps replica i meets the members of
// its random group G (one partner for n = 2) point to point and takes the heavy-ball step
//   d_j = theta_j - phi_j
//   delta_i = alpha delta_i + beta mean_G(d) - gamma (phi_i - mean_G(phi))
//   phi_i += delta_i;  theta_i = phi_i
// What crosses the link, per member of the group, all fp32 over the stage's parameters:
//  - "outer_weights": phi_i, sent right after the previous outer step (it is known then), so
//    the transfer overlaps the next H inner steps. Before the first outer step every replica
//    holds the same phi_0, so nothing is sent for step 1;
//  - "outer_progress": d_i, at the outer step itself; the only transfer on the critical path.
// No collective, no barrier: a worker waits only for the members of its group. The final step
// of a run ends a round, as in DiLoCo. Evaluation: the slow weights phi_i (each replica's own
// pipeline on its shard of the validation windows, pooled: noloco.eval = "shards"), replica
// 0's ("replica0"), or the replicas' average ("average"); the spread between replicas is a
// diagnostic computed at each evaluation (traffic "spread", apart from the method's own).
// The outer steps run through a SyncGroup (algo/sync_group.h). In an elastic run each is a round
// among the live members of its moment: the groups are drawn among the round's members as among
// replicas (noloco_groups with the round's count and the shared seed), the weights travel in the
// round (the members of the next round are not known before it), the round's roster is a barrier
// among the live members (through the coordinator), each member evaluates its own slow weights,
// and a joiner receives its first contributor's phi and delta (its parameters equal to phi). With
// a fixed membership every member's numbers equal the in-process run's replica of the same rank.
#include "algo/noloco.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>

#include "algo/algorithm.h"
#include "algo/noloco_config.h"
#include "algo/robust.h"
#include "algo/sync_group.h"
#include "core/checksum.h"
#include "core/error.h"
#include "core/rng.h"

namespace loco {

namespace {

constexpr uint64_t kGroupTag = 0x6e6f6c6f636f4731ULL;

}  // namespace

std::vector<std::vector<int>> noloco_groups(int R, int n, uint64_t seed, int64_t k) {
  check(R >= 1 && n >= 2, "noloco groups: need at least one replica and groups of at least 2");
  const auto p = seeded_permutation(R, mix_seed(seed ^ kGroupTag, uint64_t(k)));
  const int count = std::max(1, R / n);
  std::vector<std::vector<int>> groups(static_cast<size_t>(count));
  for (int i = 0; i < R; ++i) groups[size_t(std::min(i / n, count - 1))].push_back(p[size_t(i)]);
  for (auto& g : groups) std::sort(g.begin(), g.end());
  return groups;
}

std::vector<int> noloco_group_of(int R, int n, uint64_t seed, int64_t k, int r) {
  for (auto& g : noloco_groups(R, n, seed, k))
    if (std::find(g.begin(), g.end(), r) != g.end()) return g;
  fail("noloco: replica " + std::to_string(r) + " is in no group");
}

void noloco_outer_step(const std::vector<const float*>& phis, const std::vector<const float*>& progress, int self,
                       float* phi, float* delta, float* theta, int64_t n, const NolocoStepParams& p) {
  const size_t G = phis.size();
  check(G >= 1 && progress.size() == G && self >= 0 && size_t(self) < G, "noloco step: malformed group");
  const float inv = 1.0f / float(G), alpha = float(p.alpha), beta = float(p.beta), gamma = float(p.gamma);
  for (int64_t i = 0; i < n; ++i) {
    float sum_phi = 0, sum_d = 0;
    for (size_t j = 0; j < G; ++j) {
      sum_phi += phis[j][i];
      sum_d += progress[j][i];
    }
    const float own = phi[i];  // phis[self] may alias phi: read before writing
    const float v = alpha * delta[i] + beta * (sum_d * inv) - gamma * (own - sum_phi * inv);
    delta[i] = v;
    phi[i] = own + v;
    theta[i] = phi[i];
  }
}

NolocoScreen noloco_screen(const std::vector<const float*>& phis, const std::vector<const float*>& progress,
                           int self, int64_t n, double reject_norm, double reject_distance) {
  const size_t G = phis.size();
  std::vector<double> norms(G);
  for (size_t j = 0; j < G; ++j) norms[j] = vector_norm(progress[j], n);
  const Screening by_norm = screen_norms(norms, reject_norm, "local progress", "group");
  const float* own = phis[size_t(self)];
  const double own_norm = std::max(vector_norm(own, n), 1e-30);
  Screening left_out;  // partners only: this replica's own entry is always kept
  NolocoScreen out;
  size_t k = 0;  // the next of by_norm's rejections
  for (size_t j = 0; j < G; ++j) {
    const bool by_norm_out = k < by_norm.rejected.size() && by_norm.rejected[k] == int(j);
    const std::string norm_why = by_norm_out ? by_norm.why[k++] : "";
    if (int(j) == self) {
      out.kept.push_back(j);
      continue;
    }
    const double dist = outer_gradient_norm(own, phis[j], n) / own_norm;  // relative to this replica's weights
    std::string why = norm_why;
    if (why.empty() && !std::isfinite(dist))
      why = "non-finite slow weights";
    else if (why.empty() && reject_distance > 0 && dist > reject_distance)
      why = "slow weights " + std::to_string(dist) + " of this replica's norm away, > " + std::to_string(reject_distance);
    if (why.empty()) {
      out.kept.push_back(j);
      out.distance_ratio = std::max(out.distance_ratio, dist);
    } else {
      left_out.rejected.push_back(int(j));
      left_out.why.push_back(why);
    }
  }
  out.why = describe_rejections(left_out, "partner");
  return out;
}

int noloco_keep(const NolocoScreen& s, int self, std::vector<const float*>& phis, std::vector<const float*>& progress) {
  std::vector<const float*> p2, d2;
  int used = -1;
  for (size_t j : s.kept) {
    if (int(j) == self) used = int(p2.size());
    p2.push_back(phis[j]);
    d2.push_back(progress[j]);
  }
  check(used >= 0, "internal: noloco screening left this replica out");
  phis.swap(p2);
  progress.swap(d2);
  return used;
}

NolocoStepParams noloco_step_params(const NolocoConfig& c) {
  return {c.outer_lr, c.momentum, c.pull < 0 ? c.outer_lr : c.pull};
}

std::string noloco_to_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

std::vector<float> noloco_from_bytes(const std::string& bytes, int64_t n, const std::string& who,
                                     const std::string& what) {
  if (bytes.size() != size_t(n) * sizeof(float))
    fail("noloco: " + who + " sent " + std::to_string(bytes.size()) + " bytes of " + what + ", expected " +
         std::to_string(n * 4));
  std::vector<float> v(static_cast<size_t>(n));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

namespace {

class Noloco : public Algorithm {
 public:
  Noloco(const RunConfig& cfg, const Worker& w, std::unique_ptr<SyncGroup> group)
      : cfg_(cfg.noloco),
        comm_(w.comm),
        rank_(w.rank),
        replicas_(w.replicas),
        n_(int64_t(w.params.size())),
        phi_(size_t(n_)),
        delta_(size_t(n_), 0.0f),
        progress_(size_t(n_)),
        group_(std::move(group)),
        elastic_(group_->members_change()),
        screen_(aggregate_options(cfg.outer, elastic_).screen),
        reject_norm_(cfg.outer.reject_norm) {}

  void annotate(nlohmann::json& rec) override {
    group_->annotate(rec);
    if (!screen_ || outer_steps_ == 0) return;
    rec["outer_rejected"] = rejected_;
    rec["partner_distance_ratio"] = distance_ratio_;
  }

  void start(Worker& w, bool resumed) override {
    // On a resume, phi and the weights received for the next outer step come from the state.
    if (!w.restored) phi_ = w.params;
    group_->start(w, resumed, install());  // a joiner replaces them
  }

  // The whole model at an outer step, nothing between them.
  StepAccess access(const Worker& w, int64_t done, bool last) const override {
    if (!outer_step_at(done, last)) return StepAccess::nothing();
    const std::vector<Range> all{{0, n_}};
    return {false, all, all};
  }
  bool uses_gradients(const Worker&) const override { return false; }
  // Whether step `done` ends with an outer step (every H steps, and the last one).
  bool outer_step_at(int64_t done, bool last) const { return last || done % cfg_.inner_steps == 0; }

  void after_step(Worker& w, int64_t done, bool last) override {
    group_->count_step();
    const int64_t H = cfg_.inner_steps;
    if (!outer_step_at(done, last)) return;
    SyncGroup::Round r;
    r.id = (done + H - 1) / H;  // this outer step (the last one may end a short round)
    r.step = done;
    r.take_joiners = !last;
    r.reduce = [&](Communicator& comm, int rank, int size) { exchange(w, comm, rank, size, r.id); };
    r.outer_state = [&](OuterState& s) {  // the outer step taken on copies
      s.theta = phi_;
      s.momentum = delta_;
      std::vector<float> theta(static_cast<size_t>(n_));
      noloco_outer_step(phis_, deltas_, self_, s.theta.data(), s.momentum.data(), theta.data(), n_,
                        noloco_step_params(cfg_));
    };
    r.commit = [&] {
      noloco_outer_step(phis_, deltas_, self_, phi_.data(), delta_.data(), w.params.data(), n_,
                        noloco_step_params(cfg_));
      ++outer_steps_;
      partner_phi_.clear();
      if (!last && !elastic_) start_weights(w, r.id + 1);
    };
    r.checksum = [&] { return crc32c(phi_.data(), phi_.size() * sizeof(float)); };
    group_->run_round(w, r, install());
    if (last) group_->finish_run();
  }

  // An elastic member evaluates its own slow weights (on all validation windows).
  const std::vector<float>& eval_params(Worker& w) override {
    if (elastic_ || cfg_.eval == "shards") return phi_;
    eval_buffer_ = phi_;
    share_for_eval(w.comm, eval_buffer_, cfg_.eval);
    return eval_buffer_;
  }

  std::vector<double> spread_terms(Worker& w) override {
    if (elastic_) return {};
    std::vector<float> mean = phi_;
    w.comm.all_reduce(mean.data(), n_, ReduceOp::Mean, "spread");
    double sq = 0;
    for (int64_t i = 0; i < n_; ++i) {
      const double e = double(phi_[size_t(i)]) - double(mean[size_t(i)]);
      sq += e * e;
    }
    return {sq, double(n_)};
  }

  int64_t continue_from(int64_t done) override { return group_->continue_from(done); }
  double wait_seconds() const override { return group_->wait_seconds(); }
  bool writes_checkpoints() const override { return group_->writes_checkpoints(); }
  void report(nlohmann::json& out) const override {
    out["outer_state_bytes"] = int64_t(phi_.size() + delta_.size() + progress_.size()) * 4;
    out["noloco_outer_steps"] = outer_steps_;
    group_->report(out);
  }

  // The weights received for the next outer step are part of the state: finish receiving them
  // (the members sent them right after the last outer step, before their own checkpoint).
  void save_state(TrainingState& st) override {
    st.tensors["noloco.phi"] = phi_;
    st.tensors["noloco.delta"] = delta_;
    if (pending_k_ > 0) {
      wait_weights();
      st.meta["noloco.weights_for"] = std::to_string(pending_k_);
      for (size_t j = 0; j < partner_phi_.size(); ++j)
        if (!partner_phi_[j].empty()) st.tensors["noloco.weights." + std::to_string(pending_group_[j])] = partner_phi_[j];
    }
  }
  void load_state(const TrainingState& st) override {
    st.take("noloco.phi", phi_);
    st.take("noloco.delta", delta_);
    pending_k_ = 0;
    partner_phi_.clear();
    if (!st.meta.count("noloco.weights_for")) return;
    pending_k_ = st.get_int("noloco.weights_for");
    if (pending_k_ < 1) fail("training state: noloco.weights_for must be >= 1");
    pending_group_ = group_of(pending_k_);
    partner_phi_.assign(pending_group_.size(), std::vector<float>());
    for (size_t j = 0; j < pending_group_.size(); ++j)
      if (pending_group_[j] != rank_) {
        partner_phi_[j].resize(size_t(n_));
        st.take("noloco.weights." + std::to_string(pending_group_[j]), partner_phi_[j]);
      }
    received_ = true;
  }

 private:
  std::vector<int> group_of(int64_t k) const {
    return noloco_group_of(replicas_, cfg_.group_size, uint64_t(cfg_.seed), k, rank_);
  }

  // Outer step k's exchange within this member's group (drawn among the `size` members of the
  // round): the partners' slow weights phi (sent after the previous outer step in a fixed world,
  // here in an elastic one) and local progress d; then the screening. Leaves the step's inputs in
  // phis_, deltas_ and self_ (only temporaries: the group may redo it).
  void exchange(Worker& w, Communicator& comm, int rank, int size, int64_t k) {
    const auto group = noloco_group_of(size, cfg_.group_size, uint64_t(cfg_.seed), k, rank);
    self_ = int(std::find(group.begin(), group.end(), rank) - group.begin());
    for (int64_t i = 0; i < n_; ++i) progress_[size_t(i)] = w.params[size_t(i)] - phi_[size_t(i)];
    // Sends first, so that no member waits on another's receive (send_start takes its payload by
    // value: packed per partner, then moved). Received into members, which outlive a failed
    // attempt's communicator.
    if (elastic_) weights_in_.assign(group.size(), std::string());
    else finish_weights(k, group);
    progress_in_.assign(group.size(), std::string());
    std::vector<Communicator::Handle> handles;
    for (int m : group)
      if (m != rank) {
        if (elastic_) handles.push_back(comm.send_start(m, noloco_to_bytes(phi_), "outer_weights"));
        handles.push_back(comm.send_start(m, noloco_to_bytes(progress_), "outer_progress"));
      }
    for (size_t j = 0; j < group.size(); ++j)
      if (group[j] != rank) {
        if (elastic_) handles.push_back(comm.recv_start(group[j], &weights_in_[j], "outer_weights"));
        handles.push_back(comm.recv_start(group[j], &progress_in_[j], "outer_progress"));
      }
    for (auto& h : handles) comm.wait(h);
    const std::string noun = elastic_ ? "member " : "replica ", of = elastic_ ? " of the round" : "";
    partner_progress_.assign(group.size(), std::vector<float>());
    if (elastic_) partner_phi_.assign(group.size(), std::vector<float>());
    phis_.assign(group.size(), nullptr);
    deltas_.assign(group.size(), nullptr);
    for (size_t j = 0; j < group.size(); ++j) {
      if (int(j) == self_) {
        phis_[j] = phi_.data();
        deltas_[j] = progress_.data();
        continue;
      }
      const std::string who = noun + std::to_string(group[j]) + of;
      if (elastic_) partner_phi_[j] = noloco_from_bytes(weights_in_[j], n_, who, "weights");
      partner_progress_[j] = noloco_from_bytes(progress_in_[j], n_, who, "local progress");
      deltas_[j] = partner_progress_[j].data();
      phis_[j] = partner_phi_[j].empty() ? phi_.data() : partner_phi_[j].data();  // step 1: the common phi_0
    }
    if (!screen_) return;
    const auto s = noloco_screen(phis_, deltas_, self_, n_, reject_norm_, cfg_.reject_distance);
    distance_ratio_ = s.distance_ratio;
    rejected_ = int(group.size() - s.kept.size());
    if (rejected_ && elastic_)
      std::cerr << "loco: warning: round " << k << ", left out: " << s.why << "\n";
    else if (rejected_)
      std::cerr << "loco: warning: outer step " << k << " of replica " << rank << ", left out: " << s.why << "\n";
    self_ = noloco_keep(s, self_, phis_, deltas_);
  }

  // Right after outer step k - 1 in a fixed world: send phi to the members of this replica's
  // group at step k and post the receptions of theirs; the transfers overlap the next H inner steps.
  void start_weights(Worker& w, int64_t k) {
    pending_k_ = k;
    pending_group_ = group_of(k);
    weights_in_.assign(pending_group_.size(), std::string());
    weight_handles_.clear();
    for (int m : pending_group_)
      if (m != w.rank) weight_handles_.push_back(w.comm.send_start(m, noloco_to_bytes(phi_), "outer_weights"));
    for (size_t j = 0; j < pending_group_.size(); ++j)
      if (pending_group_[j] != w.rank)
        weight_handles_.push_back(w.comm.recv_start(pending_group_[j], &weights_in_[j], "outer_weights"));
    received_ = false;
  }

  void wait_weights() {
    if (received_) return;
    for (auto& h : weight_handles_) comm_.wait(h);
    weight_handles_.clear();
    partner_phi_.assign(pending_group_.size(), std::vector<float>());
    for (size_t j = 0; j < pending_group_.size(); ++j)
      if (pending_group_[j] != rank_)
        partner_phi_[j] = noloco_from_bytes(weights_in_[j], n_, "replica " + std::to_string(pending_group_[j]), "weights");
    weights_in_.clear();
    received_ = true;
  }

  // The members' phi for outer step k, in group order (empty for this replica). Step 1 needs
  // none: every replica starts from the same phi_0.
  void finish_weights(int64_t k, const std::vector<int>& group) {
    if (pending_k_ == 0) {
      partner_phi_.assign(group.size(), std::vector<float>());
      return;
    }
    check(pending_k_ == k && pending_group_ == group, "noloco: weights were exchanged for outer step " +
                                                           std::to_string(pending_k_) + ", not " + std::to_string(k));
    wait_weights();
    pending_k_ = 0;
  }

  SyncGroup::Install install() {
    return [this](Worker& w, OuterState& s) {
      phi_ = std::move(s.theta);
      delta_ = std::move(s.momentum);
      w.params = phi_;
    };
  }

  NolocoConfig cfg_;
  Communicator& comm_;  // the stage's replicas
  int rank_, replicas_;
  int64_t n_;
  std::vector<float> phi_, delta_, progress_, eval_buffer_;
  int64_t outer_steps_ = 0;
  std::unique_ptr<SyncGroup> group_;
  const bool elastic_;  // members come and go (group_->members_change()): weights sent in the round
  // A fixed world's weights exchange for outer step pending_k_ (0: none in flight).
  int64_t pending_k_ = 0;
  std::vector<int> pending_group_;
  std::vector<std::string> weights_in_, progress_in_;
  std::vector<Communicator::Handle> weight_handles_;
  bool received_ = true;
  // The outer step's inputs, in group order: the partners' phi (empty: this member's, or the
  // common phi_0) and progress, and the pointers the step reads (self_: this member).
  std::vector<std::vector<float>> partner_phi_, partner_progress_;
  std::vector<const float*> phis_, deltas_;
  int self_ = 0;
  bool screen_;  // outer.screen (auto: on in elastic runs, off in-process and under MPI)
  double reject_norm_;
  int rejected_ = 0;           // partners left out of the last outer step
  double distance_ratio_ = 0;  // of the last outer step (noloco_screen)
};

}  // namespace

std::unique_ptr<Algorithm> make_noloco(const RunConfig& cfg, const Worker& w, std::unique_ptr<SyncGroup> group) {
  return std::make_unique<Noloco>(cfg, w, std::move(group));
}

// NoLoCo draws its groups among each round's members and evaluates each member's own slow weights
// there: it runs every NoLoCo configuration elastically.
std::string noloco_elastic_refusal(const RunConfig&) { return ""; }

std::unique_ptr<Algorithm> make_noloco(const RunConfig& cfg, const Worker& w) {
  return make_noloco(cfg, w, std::make_unique<FixedGroup>());
}

void add_noloco_keys(ConfigSchema& s, NolocoConfig& nl) {
  s.add("noloco.inner_steps", &nl.inner_steps, "H: inner steps between NoLoCo outer steps", 1);
  s.add("noloco.outer_lr", &nl.outer_lr, "beta: outer learning rate on the group's mean local progress", 0.0, 10.0);
  s.add("noloco.momentum", &nl.momentum, "alpha: heavy-ball outer momentum", 0.0, 0.999999);
  s.add("noloco.pull", &nl.pull, "gamma: pull toward the group's mean slow weights (-1: = noloco.outer_lr, as the "
        "authors' code)", -1.0, 10.0);
  s.add("noloco.group_size", &nl.group_size, "n: replicas per group (2: one partner; leftovers join the last group)",
        2, 1 << 20);
  s.add("noloco.routing", &nl.routing, "pipeline paths per microbatch (pipeline.stages > 1): random or fixed",
        {"random", "fixed"});
  s.add("noloco.seed", &nl.seed, "seed of the groups and routes (shared by every worker)");
  s.add("noloco.eval", &nl.eval, "evaluated weights: shards (each replica's slow weights on its share of the "
        "validation windows, pooled), replica0, or average (of the replicas)", {"shards", "replica0", "average"});
  s.add("noloco.reject_distance", &nl.reject_distance,
        "screening (outer.screen): a partner whose slow weights are farther from this replica's than this times "
        "their norm is left out of the outer step (0: no distance rule)", 0.0, 1e9);
}

void check_noloco_config(const RunConfig& c, const ConfigCheck& need) {
  if (c.method() == MethodId::Noloco) {
    need(c.noloco.pull == -1 || c.noloco.pull >= 0, "noloco.pull must be >= 0 (or -1: equal to noloco.outer_lr)");
    need(c.outer.codec == "fp32", "outer.codec applies to algorithm = \"streaming\"; noloco sends fp32");
  }
}

}  // namespace loco
