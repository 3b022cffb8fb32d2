// Streaming DiLoCo (docs/streaming.md). Three changes to DiLoCo, each switchable:
//  1. fragments: the model is split into fragments of blocks (plus one for the non-block
//     parameters), each synchronized every H steps at its own offset j floor(H / N), so only
//     one fragment's bytes are on the wire at a time; fragments not being synchronized keep
//     training;
//  2. overlap: a fragment's reduction starts after inner step t and is applied after step
//     t + tau, while the replica keeps training; the result is merged as
//     alpha * local + (1 - alpha) * synchronized, for every tau (the paper's Algorithm 2; tau 0
//     with alpha 0 is DiLoCo). Entries this node never trains (partial updates) are replaced.
//     Any tau < H is allowed: several fragments may be in flight at once;
//  3. quantized outer gradients: each replica encodes its own Delta_{m,j}; the payloads are
//     all-gathered and summed in float32 in rank order, or reduce-scattered (each shard summed
//     by one replica in float32 and re-encoded) and all-gathered (comm/codec.h).
// In fp32 the fragment's parameters are averaged with the ring all-reduce, as in DiLoCo.
// Screening and robust rules (outer.screen, outer.aggregate; algo/robust.h), over the paths
// where every member sees what each member contributed: the screened mean in fp32 exchanges the
// members' norms first (8 bytes each, waited for when the sync starts, so one message latency is
// not overlapped), then all-reduces the accepted members' parameters (with nobody rejected the
// same bits as without screening); every other case sends each member's encoded delta straight
// to every other member ((M - 1) payloads sent per member, as the all-gather), and each member
// decodes them, screens their norms and applies the rule. The reduce-scatter cannot be screened:
// a member sums the others' shards and sends only the sum, so nobody else sees a contribution;
// it is refused with screening or a robust rule.
// The last step ends every fragment's round, as DiLoCo's last round ends at the last step:
// every sync still in flight is applied; a fragment whose latest sync started within the last
// tau steps (the largest tau of any replica) ends with it, and every other fragment takes one
// final synchronization of its parameters at the last step. So no fragment takes two outer
// steps in a row; such a fragment's final model leaves out the at most tau inner steps after its
// sync started.
// With the outer state held by the caller (algo/algorithm.h, OuterResult; loco.torch's
// outer_device) the schedule, the communication and the reduce-scatter's shard sums stay here;
// the caller encodes its delta, decodes the payloads, takes the outer step and merges.
// The syncs' members come from a SyncGroup (algo/sync_group.h). In an elastic run each fragment's
// sync is a round among the live members of its moment, reduced as above among the round's
// members (screened by default, outer.screen = auto, except with the reduce-scatter asked for),
// but completed within the round: the result is then held, as any sync in flight, and merged tau
// steps later, so with a fixed membership every number equals the in-process run's (the
// communication does not overlap the inner steps there). A joiner starts from the outer
// parameters with every completed sync's outer step taken, its parameters equal to them, and the
// screening histories.
#include "algo/streaming.h"

#include <algorithm>
#include <iostream>

#include "algo/streaming_config.h"
#include "core/checksum.h"
#include "core/error.h"
#include "core/lists.h"
#include "core/parallel.h"
#include "core/fs.h"

namespace loco {

std::vector<FragmentPlan> plan_fragments(int L, int fragment_blocks, const std::string& pattern, int64_t H) {
  check(fragment_blocks >= 0, "streaming.fragment_blocks must be >= 0");
  check(pattern == "strided" || pattern == "sequential", "streaming.pattern must be strided or sequential");
  std::vector<FragmentPlan> out;
  if (fragment_blocks == 0) {
    FragmentPlan f;
    for (int l = 0; l < L; ++l) f.blocks.push_back(l);
    f.nonblock = true;
    return {f};
  }
  const int P = (L + fragment_blocks - 1) / fragment_blocks;
  for (int j = 0; j < P; ++j) {
    FragmentPlan f;
    for (int l = 0; l < L; ++l)
      if (pattern == "strided" ? l % P == j : l / fragment_blocks == j) f.blocks.push_back(l);
    out.push_back(f);
  }
  FragmentPlan rest;
  rest.nonblock = true;
  out.push_back(rest);
  const int64_t F = int64_t(out.size());
  for (int64_t j = 0; j < F; ++j) out[size_t(j)].offset = j * (H / F);
  return out;
}

bool syncs_at(const FragmentPlan& f, int64_t step, int64_t H) { return step > f.offset && (step - f.offset) % H == 0; }

int64_t last_sync_start(const FragmentPlan& f, int64_t step, int64_t H) {
  if (step < f.offset + H) return -1;
  return f.offset + (step - f.offset) / H * H;
}

int64_t worker_tau(int64_t tau, const std::string& list, int rank, int replicas) {
  if (list.empty()) return tau;
  const auto values = parse_int_list(list, "streaming.worker_tau", 0, "a non-negative integer");
  if (int(values.size()) != replicas)
    fail("streaming.worker_tau has " + std::to_string(values.size()) + " entries for " + std::to_string(replicas) +
         " replicas");
  return values[size_t(rank)];
}

Streaming::Streaming(const RunConfig& cfg, const Worker& w, std::unique_ptr<SyncGroup> group, const Fault& fault)
    : cfg_(cfg.streaming),
      outer_(cfg.outer),
      plan_(plan_fragments(cfg.model.num_layers, cfg.streaming.fragment_blocks, cfg.streaming.pattern,
                           cfg.outer.inner_steps)),
      codec_(make_codec({cfg.outer.codec, cfg.outer.rounding, cfg.outer.block, cfg.outer.keep_fraction})),
      reduce_setting_(cfg.outer.reduce),
      last_reduce_(choose_encoded_reduce(cfg.outer.reduce, w.replicas)),
      tau_(worker_tau(cfg.streaming.tau, cfg.streaming.worker_tau, w.rank, w.replicas)),
      seed_(uint64_t(cfg.train.seed)),
      run_steps_(cfg.train.steps),
      average_(count_vector_average(cfg, w, group->members_change())),
      comm_(w.comm),
      num_params_(w.params.size()),
      group_(std::move(group)),
      elastic_(group_->members_change()) {
  // outer.screen = auto is on in elastic runs, except with quantized outer gradients
  // reduce-scattered on request (no member sees another's contribution there: said at start).
  const bool scattered = cfg.outer.codec != "fp32" && cfg.outer.reduce == "reduce-scatter";
  if (elastic_ && scattered && cfg.outer.screen == "auto" && cfg.outer.aggregate == "mean")
    std::cerr << "loco: warning: outer.reduce = \"reduce-scatter\": the members' contributions are not screened "
                 "(no member sees another's); outer.reduce = \"auto\" or \"all-gather\" screens them\n";
  set_robustness(aggregate_options(cfg.outer, elastic_ && !scattered && cfg.partial.slices == 1), fault, elastic_ ? "round member" : "replica");
  norm_history_.resize(plan_.size());
  group_->set_norm_histories(plan_.size());
  const auto& layout = w.layout();
  // With a pipeline, a fragment syncs the part of it this stage holds (maybe nothing).
  const auto& stage = layout.stage();
  for (const auto& f : plan_) {
    std::vector<Range> r;
    for (int l : f.blocks)
      if (l >= stage.first_block && l < stage.last_block) r.push_back(layout.block_range(l));
    if (f.nonblock)
      for (const auto& x : layout.nonblock_ranges()) r.push_back(x);
    ranges_.push_back(merge_ranges(r));
    // Entries this node trains merge with alpha; the others (frozen slices) are replaced.
    const auto trained = intersect_ranges(ranges_.back(), w.trainable.ranges());
    std::vector<Segment> segs;
    int64_t packed = 0;
    for (const auto& x : ranges_.back()) {
      int64_t at = x.begin;
      for (const auto& t : intersect_ranges({x}, trained)) {
        if (t.begin > at) segs.push_back({at, t.begin, packed + (at - x.begin), false});
        segs.push_back({t.begin, t.end, packed + (t.begin - x.begin), true});
        at = t.end;
      }
      if (at < x.end) segs.push_back({at, x.end, packed + (at - x.begin), false});
      packed += x.size();
    }
    segments_.push_back(std::move(segs));
  }
  if (cfg.streaming.offload_outer) {
    scratch_dir_ = cfg.train.out_dir;
    scratch_ = scratch_dir_ + "/outer-state-" + std::to_string(w.world_rank) + ".scratch";
  }
  max_tau_ = tau_;
  if (!cfg.streaming.worker_tau.empty())
    for (int r = 0; r < w.replicas; ++r)
      max_tau_ = std::max(max_tau_, worker_tau(cfg.streaming.tau, cfg.streaming.worker_tau, r, w.replicas));
  // A fragment's sync must be applied before its next one starts, H steps later.
  if (max_tau_ >= outer_.inner_steps)
    fail("streaming.tau (" + std::to_string(max_tau_) + ") must be smaller than outer.inner_steps (" +
         std::to_string(outer_.inner_steps) + ")");
}

void Streaming::set_robustness(const AggregateOptions& aggregate, const Fault& fault, const std::string& noun) {
  aggregate_ = aggregate;
  noun_ = noun;
  fault_ = fault;
  robust_ = aggregate_.screen || aggregate_.rule != "mean";
  if (robust_ && !codec_->lossless() && reduce_setting_ == "reduce-scatter")
    fail("outer.reduce = \"reduce-scatter\" cannot be screened or aggregated robustly (no member sees the others' "
         "contributions): use outer.reduce = \"all-gather\" (or auto) with outer.screen or outer.aggregate");
}

void Streaming::start(Worker& w, bool resumed) {
  if (!w.restored && !held_) written_store().write_all(w.params, std::vector<float>(num_params_, 0.0f));
  group_->start(w, resumed, install());  // a joiner replaces them
}

SyncGroup::Install Streaming::install() {
  return [this](Worker& w, OuterState& s) {
    check(s.norm_history.size() == fragments(), "internal: a join state without every fragment's screening history");
    install_outer_state(s.theta, s.momentum);
    norm_history_ = std::move(s.norm_history);
    w.params = s.theta;
  };
}

OuterStore& Streaming::store() const {
  check(!held_, "internal: the caller holds the outer state");
  if (!store_) {  // made at first use: a caller holding the outer state never allocates it here
    if (!scratch_.empty()) make_dirs(scratch_dir_);
    store_ = std::make_unique<OuterStore>(ranges_, int64_t(num_params_), scratch_);
  }
  return *store_;
}

OuterStore& Streaming::written_store() {
  OuterStore& st = store();
  for (auto& u : unwritten_) {
    st.exchange(u.fragment, u.theta, u.momentum);  // in memory, buffers swapped: no copy
    give_spare(u.theta);
    give_spare(u.momentum);
  }
  unwritten_.clear();
  return st;
}

std::string Streaming::outer_elsewhere_refusal() const {
  if (elastic_) return "an elastic run keeps the outer state on the host";
  if (robust_ || fault_.kind != Fault::Kind::None)
    return "outer.screen, outer.aggregate and outer.fault need the outer state on the host";
  if (!scratch_.empty()) return "streaming.offload_outer keeps the outer state in a host file";
  const std::string f = codec_->name();
  if (f == "random-drop" || f == "topk") return "outer.codec = \"" + f + "\" runs on the host only";
  if (outer_.rounding == "stochastic")
    return "outer.rounding = \"stochastic\" runs on the host only (its random numbers are loco's)";
  return "";
}

void Streaming::hold_outer_elsewhere() {
  held_ = true;
}

std::vector<std::vector<OuterSegment>> Streaming::outer_segments() const {
  std::vector<std::vector<OuterSegment>> out;
  for (const auto& segs : segments_) {
    out.emplace_back();
    for (const auto& x : segs) out.back().push_back({x.begin, x.end, x.packed, x.trained});
  }
  return out;
}

std::vector<size_t> Streaming::outer_starts(const Worker&, int64_t done, bool last) const {
  std::vector<size_t> out;
  for (size_t j = 0; j < plan_.size(); ++j)
    if (starts_sync(j, done, last)) out.push_back(j);
  return out;
}

int Streaming::outer_shards(const Worker& w) const {
  return choose_encoded_reduce(reduce_setting_, w.replicas) == EncodedReduce::ReduceScatter ? w.replicas : 1;
}

void Streaming::provide_outer(size_t fragment, std::vector<std::string> payloads) {
  check(held_ && fragment < plan_.size(), "internal: provide_outer without a held outer state, or no such fragment");
  provided_[fragment] = std::move(payloads);
}

std::vector<OuterResult> Streaming::take_outer_results() { return std::exchange(results_, {}); }

std::vector<OuterResult> Streaming::peek_outer_results() {
  std::vector<OuterResult> out;
  if (elastic_ || !(held_ || caller_mixes_)) return out;
  for (auto& p : pending_) {
    if (p.peeked || (held_ ? !p.completed || p.own : !p.stepped)) continue;
    OuterResult r;
    r.fragment = p.fragment;
    if (held_) {
      r.avg = p.avg;
      r.payloads = p.gathered;
    }
    r.reduce_scatter = p.reduce == EncodedReduce::ReduceScatter;
    p.peeked = true;
    out.push_back(std::move(r));
  }
  return out;
}

bool Streaming::starts_sync(size_t j, int64_t done, bool last) const {
  if (ranges_[j].empty()) return false;  // not on this pipeline stage
  const bool due = syncs_at(plan_[j], done, outer_.inner_steps);
  // The last step ends every fragment's round that did not just end with a recent sync.
  const int64_t started = last_sync_start(plan_[j], done, outer_.inner_steps);
  const bool final = last && !due && !(started >= 0 && started >= done - max_tau_);
  return due || final;
}

// A sync applied writes its fragment, and reads the entries merged with alpha (apply()).
void Streaming::add_applied(StepAccess& a, size_t j, bool replace) const {
  a.writes.insert(a.writes.end(), ranges_[j].begin(), ranges_[j].end());
  if (!replace && cfg_.alpha != 0)
    for (const auto& s : segments_[j])
      if (s.trained) a.reads.push_back({s.begin, s.end});
}

StepAccess Streaming::merge_access(const Worker& w, int64_t done, bool last) const {
  StepAccess a = StepAccess::nothing();
  if (last || elastic_) return a;  // after_step applies them (the last step replaces; a round takes everything)
  for (const auto& p : pending_) {
    if (p.apply_at > done) break;
    add_applied(a, p.fragment, false);
  }
  a.reads = merge_ranges(a.reads);
  a.writes = merge_ranges(a.writes);
  if (held_ || caller_mixes_) a.reads.clear();  // the caller applies the result, or mixes it, itself
  return a;
}

void Streaming::merge_step(Worker& w, int64_t done, bool last) {
  if (last || elastic_) return;
  while (!pending_.empty() && pending_.front().apply_at <= done) {
    apply(w, pending_.front(), false, true);
    pending_.pop_front();
  }
}

StepAccess Streaming::access(const Worker& w, int64_t done, bool last) const {
  // A sync that starts reads its fragment; one applied writes it (after_step below, in the same
  // order).
  StepAccess a = StepAccess::nothing();
  for (const auto& p : pending_) {
    if (!(p.apply_at <= done || last)) break;
    add_applied(a, p.fragment, last);
  }
  // With partial updates the count-vector average reads only the entries this replica trains
  // (begin_sync); a codec, a fault or a robust rule packs the whole fragment.
  const bool trained_only = w.trainable.size() < int64_t(num_params_) && codec_->lossless() && !robust_ &&
                            fault_.kind == Fault::Kind::None;
  for (size_t j = 0; j < plan_.size(); ++j) {
    if (!starts_sync(j, done, last)) continue;
    const auto reads = trained_only ? intersect_ranges(ranges_[j], w.trainable.ranges()) : ranges_[j];
    a.reads.insert(a.reads.end(), reads.begin(), reads.end());
    if (tau_ == 0 || last) add_applied(a, j, last);
  }
  a.reads = merge_ranges(a.reads);
  a.writes = merge_ranges(a.writes);
  // Held outer state: a codec's delta is the caller's to encode, and fp32 sends the parameters
  // read only with other replicas; nothing is written here (the writes still say which steps
  // apply a sync: the caller applies it then).
  if (held_ && (!codec_->lossless() || w.replicas == 1)) a.reads.clear();
  // A step with a round, when members come and go, may take in the run's whole state (a member
  // dropped and taken in again).
  if (elastic_ && (last || !a.reads.empty() || !a.writes.empty())) {
    a = StepAccess::everything(int64_t(num_params_));
    a.gradients = false;
  }
  return a;
}

int64_t Streaming::quiet_until(const Worker& w, int64_t done, bool last) const {
  if (last) return done + 1;
  int64_t next = run_steps_;  // the last step ends every round
  for (const auto& p : pending_)
    if (p.apply_at > done) next = std::min(next, p.apply_at);  // merges still to come
  for (size_t j = 0; j < plan_.size(); ++j) {
    if (ranges_[j].empty()) continue;
    if (tau_ > 0 && starts_sync(j, done, false)) next = std::min(next, done + tau_);  // this step's syncs' merges
    const int64_t started = last_sync_start(plan_[j], done, outer_.inner_steps);
    next = std::min(next, started < 0 ? plan_[j].offset + outer_.inner_steps : started + outer_.inner_steps);
  }
  return std::max(next, done + 1);
}

void Streaming::after_step(Worker& w, int64_t done, bool last) {
  group_->count_step();
  while (!pending_.empty() && (pending_.front().apply_at <= done || last)) {
    apply(w, pending_.front(), last);
    pending_.pop_front();
  }
  for (size_t j = 0; j < plan_.size(); ++j) {
    if (!starts_sync(j, done, last)) continue;
    if (!sync_fragment(w, j, done, last)) break;  // dropped: this step's other syncs are not this worker's either
    if (tau_ == 0 || last) {
      apply(w, pending_.back(), last);
      pending_.pop_back();
    }
  }
  if (last) group_->finish_run();
}

const std::vector<float>& Streaming::eval_params(Worker& w) {
  if (cfg_.eval == "outer") {
    written_store().read_params(eval_buffer_);
    return eval_buffer_;
  }
  eval_buffer_ = w.params;
  share_for_eval(w.comm, eval_buffer_, cfg_.eval);
  return eval_buffer_;
}

std::string Streaming::eval_note(int64_t step) const {
  if (cfg_.eval != "outer") return "";
  // A sync started at s is in the outer parameters from s + tau on (all of them after the
  // last step, which ends every round).
  const bool final = step == run_steps_;
  std::vector<int64_t> synced;
  for (size_t j = 0; j < plan_.size(); ++j)
    if (!ranges_[j].empty())
      synced.push_back(final ? step : last_sync_start(plan_[j], step - tau_, outer_.inner_steps));
  if (std::adjacent_find(synced.begin(), synced.end(), std::not_equal_to<>()) == synced.end()) return "";
  std::string steps;
  bool initial = false;
  for (size_t k = 0; k < synced.size(); ++k) {
    steps += (k ? (k + 1 == synced.size() ? " and " : ", ") : "") + std::to_string(std::max<int64_t>(0, synced[k]));
    initial = initial || synced[k] < 0;
  }
  return "outer parameters of fragments last synchronized at steps " + steps +
         (initial ? " (0: not yet, the initial values)" : "") +
         ", a mix rather than one model state; see streaming.eval";
}

// Syncs in flight are saved completed, as their averages (pending.j.avg). With the outer state
// held by the caller, the caller saves the outer parameters and momentum and turns each pending
// entry into that average: it gets a codec's decoded mean delta here (pending.j.delta) and
// subtracts it from its outer parameters, and makes a lone replica's (pending.j.own) from the
// parameters it kept.
void Streaming::save_state(TrainingState& st) {
  if (!held_) written_store().read_all(st.tensors["outer.params"], st.tensors["outer.momentum"]);
  std::string list;
  for (auto& p : pending_) {
    complete(comm_, p);
    const std::string key = "pending." + std::to_string(p.fragment);
    if (held_ && p.own) {
      st.meta[key + ".own"] = "1";
    } else if (held_ && !p.gathered.empty()) {
      std::vector<float> delta(size_t(total_size(ranges_[p.fragment])), 0.0f);
      decode_mean(p, delta);
      st.tensors[key + ".delta"] = std::move(delta);
    } else {
      st.tensors[key + ".avg"] = p.avg_from_payloads ? stepped_average(p) : p.avg;
    }
    st.meta[key + ".apply_at"] = std::to_string(p.apply_at);
    if (!list.empty()) list += ',';
    list += std::to_string(p.fragment);
  }
  st.meta["pending"] = list;
  st.meta["outer.norm_history"] = norm_history_text(norm_history_);  // with the pending syncs' records
}

void Streaming::load_state(const TrainingState& st) {
  if (!held_) {
    std::vector<float> theta(num_params_), momentum(num_params_);
    st.take("outer.params", theta);
    st.take("outer.momentum", momentum);
    written_store().write_all(theta, momentum);
  } else {  // the caller loads them
    st.taken_by_caller("outer.params");
    st.taken_by_caller("outer.momentum");
  }
  const auto h = st.meta.find("outer.norm_history");
  norm_history_ = parse_norm_history(h == st.meta.end() ? "" : h->second, plan_.size(), "training state");
  pending_.clear();
  const auto it = st.meta.find("pending");
  if (it == st.meta.end() || it->second.empty()) return;
  for (int64_t fragment : parse_int_list(it->second, "training state: pending", 0, "a fragment index")) {
    Pending p;
    p.fragment = size_t(fragment);
    if (p.fragment >= plan_.size()) fail("training state: pending fragment out of range");
    const std::string key = "pending." + std::to_string(fragment);
    p.apply_at = st.get_int(key + ".apply_at");
    p.avg.assign(size_t(total_size(ranges_[p.fragment])), 0.0f);
    st.take(key + ".avg", p.avg);
    p.completed = true;
    if (!held_) written_store().read(p.fragment, p.theta, p.momentum);
    pending_.push_back(std::move(p));
  }
}

void Streaming::report(nlohmann::json& out) const {
  group_->report(out);
  int64_t largest = 0;
  for (const auto& r : ranges_) largest = std::max(largest, total_size(r));
  out["fragments"] = int64_t(plan_.size());
  out["largest_fragment_params"] = largest;
  // Held for the whole run (all of it, or nothing when offloaded), plus what a sync in flight
  // holds: the fragment's outer parameters and momentum and the received average.
  out["outer_state_bytes"] = held_ ? 0 : store().resident_bytes() + 3 * largest * 4;
  out["outer_state_bytes_needed_at_once"] = 3 * largest * 4;
  out["outer_state_offloaded"] = !scratch_.empty();
  out["tau"] = tau_;
  if (!codec_->lossless())
    out["outer_reduce"] = last_reduce_ == EncodedReduce::AllGather ? "all-gather" : "reduce-scatter";
}

void Streaming::annotate(nlohmann::json& rec) {
  group_->annotate(rec);
  if (robust_ && rejected_ >= 0) rec["outer_rejected"] = rejected_;
}

bool Streaming::sync_fragment(Worker& w, size_t j, int64_t step, bool last) {
  if (!elastic_) {
    // Overlapped: the sync completes when its result is due. The communication thread writes
    // into the element, so it is placed first: references to deque elements stay valid across
    // push_back/pop_front.
    begin_sync(w.comm, w.rank, w.replicas, w.params, j, step, pending_.emplace_back());
    return true;
  }
  // A round among the members of the moment, completed within it; its result is then held as
  // any sync in flight and merged tau steps later (so with a fixed membership every number
  // equals the in-process run's).
  std::unique_ptr<Pending> p;
  const std::vector<NormHistory> history = norm_history_;  // each attempt screens from it
  SyncGroup::Round r;
  r.id = step * int64_t(fragments()) + int64_t(j);
  r.step = step;
  r.take_joiners = !last;
  r.reduce = [&](Communicator& comm, int rank, int size) {
    p = std::make_unique<Pending>();
    norm_history_ = history;
    begin_sync(comm, rank, size, w.params, j, step, *p);
    complete(comm, *p);
  };
  r.outer_state = [&](OuterState& s) {
    latest_outer_state(s.theta, s.momentum, p.get());
    s.norm_history = norm_history_;
  };
  r.commit = [&] { pending_.push_back(std::move(*p)); };
  r.checksum = [&] {
    std::vector<float> theta, momentum;
    latest_outer_state(theta, momentum, nullptr);
    return crc32c(theta.data(), theta.size() * sizeof(float));
  };
  return group_->run_round(w, r, install());
}

void Streaming::apply(Worker& w, Pending& p, bool replace, bool merging) {
  // A merge that writes the outer state to the store at once (no caller mixing it from values
  // taken ahead) takes the outer step in the store itself when the sync reads it there.
  const bool to_store = !held_ && !(merging && caller_mixes_);
  complete(comm_, p, held_ ? Step::none : to_store && p.in_store ? Step::in_place : Step::ahead);
  if (held_) {
    OuterResult r;
    r.fragment = p.fragment;
    r.replace = replace;
    r.own = p.own;
    r.avg = std::move(p.avg);
    r.payloads = std::move(p.gathered);
    r.reduce_scatter = p.reduce == EncodedReduce::ReduceScatter;
    results_.push_back(std::move(r));
    return;
  }
  // The caller merges this one from the synchronized values it took ahead (prepare_merges'
  // buffers, peek_outer_results), and the outer state goes to the store at the store's next use
  // (streaming.h).
  const bool by_caller = merging && caller_mixes_;
  check(!by_caller || p.peeked, "internal: the caller merges fragment " + std::to_string(p.fragment) +
                                    " without having taken its synchronized values ahead");
  step_outer(p);
  if (by_caller) {
    unwritten_.push_back({p.fragment, std::move(p.theta), std::move(p.momentum)});
  } else {
    // The new outer state: in the store already (stepped there), or written to it now.
    OuterStore& st = written_store();
    if (!p.in_store) st.exchange(p.fragment, p.theta, p.momentum);  // p.theta's buffer undefined after it
    const float* theta = st.resident() ? st.resident_theta(p.fragment) : p.theta.data();  // offloaded: written, kept
    const float a = float(cfg_.alpha);
    for (const auto& s : segments_[p.fragment]) {
      float* local = w.params.data() + s.begin;
      const float* synced = theta + s.packed;
      if (!replace && s.trained && a != 0.0f)
        each_index(s.end - s.begin, [=](int64_t i) { local[i] = a * local[i] + (1.0f - a) * synced[i]; });
      else  // alpha 0 replaces: the local values are not read
        each_index(s.end - s.begin, [=](int64_t i) { local[i] = synced[i]; });
    }
  }
  give_spare(p.theta);
  give_spare(p.momentum);
  give_spare(p.avg);
}

void Streaming::latest_outer_state(std::vector<float>& theta, std::vector<float>& momentum, Pending* extra) {
  written_store().read_all(theta, momentum);
  std::vector<Pending*> all;
  for (auto& p : pending_) all.push_back(&p);
  if (extra) all.push_back(extra);
  for (Pending* q : all) {
    Pending& p = *q;
    complete(comm_, p);
    check(!p.stepped, "internal: an elastic run's sync was stepped ahead of its merge");
    read_outer_state(p);
    std::vector<float> t = p.theta, m = p.momentum;
    outer_sgd_step(t.data(), m.data(), p.avg.data(), int64_t(t.size()), outer_);
    int64_t at = 0;
    for (const auto& r : ranges_[p.fragment]) {
      std::copy(t.begin() + at, t.begin() + at + r.size(), theta.begin() + r.begin);
      std::copy(m.begin() + at, m.begin() + at + r.size(), momentum.begin() + r.begin);
      at += r.size();
    }
  }
}

void Streaming::install_outer_state(const std::vector<float>& theta, const std::vector<float>& momentum) {
  pending_.clear();
  written_store().write_all(theta, momentum);
}

std::unique_ptr<Algorithm> make_streaming(const RunConfig& cfg, const Worker& w, std::unique_ptr<SyncGroup> group,
                                          const Fault& fault) {
  return std::make_unique<Streaming>(cfg, w, std::move(group), fault);
}

// Each member's own tau, and evaluation over the replicas' communicator, need a fixed world.
std::string streaming_elastic_refusal(const RunConfig& cfg) {
  if (!cfg.streaming.worker_tau.empty())
    return "distributed.backend = \"elastic\" takes one streaming.tau for all members (streaming.worker_tau = \"\")";
  if (cfg.streaming.eval != "outer")
    return "distributed.backend = \"elastic\" evaluates the outer parameters (streaming.eval = \"outer\")";
  return "";
}

std::unique_ptr<Algorithm> make_streaming(const RunConfig& cfg, const Worker& w) {
  const bool faulty = w.rank >= w.replicas - cfg.outer.faulty_replicas;
  return make_streaming(cfg, w, std::make_unique<FixedGroup>(),
                        faulty ? parse_fault(cfg.outer.fault, "outer.fault") : Fault{});
}

void add_streaming_keys(ConfigSchema& s, StreamingConfig& st) {
  s.add("streaming.fragment_blocks", &st.fragment_blocks, "|p|: blocks per fragment (0: whole model, one fragment)",
        0, 1 << 20);
  s.add("streaming.pattern", &st.pattern, "fragment pattern: strided (l mod P) or sequential", {"strided", "sequential"});
  s.add("streaming.tau", &st.tau, "tau: inner steps between starting a fragment's sync and applying it", 0);
  s.add("streaming.worker_tau", &st.worker_tau, "per-replica tau as a list, e.g. \"1,1,3,3\" (\"\": all tau)");
  s.add("streaming.alpha", &st.alpha, "alpha: weight of the local parameters when merging a delayed sync", 0.0, 1.0);
  s.add("streaming.eval", &st.eval, "parameters evaluated: outer, replica0 or average (of the replicas)",
        {"outer", "replica0", "average"});
  s.add("streaming.offload_outer", &st.offload_outer,
        "keep the outer parameters and momentum in a scratch file in the run directory; only the fragments "
        "being synchronized are in memory");
}

void check_streaming_config(const RunConfig& c, const ConfigCheck& need) {
  // A rule that needs every member's contribution (outer.aggregate other than mean, outer.screen
  // = "on") cannot see them when encoded outer gradients are reduce-scattered.
  const auto& o = c.outer;
  if (c.method() != MethodId::Streaming || o.codec == "fp32" || o.reduce != "reduce-scatter") return;
  need(o.aggregate == "mean" && o.screen != "on",
       (o.aggregate != "mean" ? "outer.aggregate = \"" + o.aggregate + "\"" : std::string("outer.screen = \"on\"")) +
           " with outer.reduce = \"reduce-scatter\" is not possible: no member sees the others' "
           "contributions there (use outer.reduce = \"all-gather\" or auto)");
}

}  // namespace loco
