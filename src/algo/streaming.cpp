// Streaming DiLoCo (spec 02-streaming.md). Three changes to DiLoCo, each switchable:
//  1. fragments: the model is split into fragments of blocks (plus one for the non-block
//     parameters), each synchronized every H steps at its own offset, so only one fragment's
//     bytes are on the wire at a time; fragments not being synchronized keep training;
//  2. overlap: a fragment's reduction starts after inner step t and is applied after step
//     t + tau, while the replica keeps training; the result is merged as
//     alpha * local + (1 - alpha) * synchronized (with tau = 0 the fragment is replaced);
//  3. quantized outer gradients: each replica encodes its own Delta_{m,j}; payloads are
//     all-gathered and summed in float32 in rank order (identical on every worker).
// In fp32 the fragment's parameters are averaged with the ring all-reduce, as in DiLoCo.
// The last step of a run applies every pending sync and then synchronizes every fragment
// that was not synchronized at that step, so the outer parameters include all inner steps.
#include "algo/streaming.h"

#include <cstring>
#include <deque>
#include <sstream>

#include "algo/algorithm.h"
#include "algo/outer_store.h"
#include "algo/partial.h"
#include "comm/codec.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/config_schema.h"
#include "io/fs.h"

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
  for (int64_t j = 0; j < F; ++j) out[size_t(j)].offset = j * H / F;
  return out;
}

bool syncs_at(const FragmentPlan& f, int64_t step, int64_t H) { return step > f.offset && (step - f.offset) % H == 0; }

int64_t worker_tau(int64_t tau, const std::string& list, int rank, int replicas) {
  if (list.empty()) return tau;
  const auto values = parse_int_list(list, "streaming.worker_tau", 0, "a non-negative integer");
  if (int(values.size()) != replicas)
    fail("streaming.worker_tau has " + std::to_string(values.size()) + " entries for " + std::to_string(replicas) +
         " replicas");
  return values[size_t(rank)];
}

namespace {

class Streaming : public Algorithm {
 public:
  Streaming(const RunConfig& cfg, const Worker& w)
      : cfg_(cfg.streaming),
        outer_(cfg.outer),
        plan_(plan_fragments(cfg.model.num_layers, cfg.streaming.fragment_blocks, cfg.streaming.pattern,
                             cfg.outer.inner_steps)),
        codec_(make_codec({cfg.outer.codec, cfg.outer.rounding, cfg.outer.block, cfg.outer.keep_fraction})),
        tau_(worker_tau(cfg.streaming.tau, cfg.streaming.worker_tau, w.rank, w.replicas)),
        seed_(uint64_t(cfg.train.seed)),
        average_(w.model.layout(), cfg.partial.slices, cfg.partial.strategy, w.rank, w.replicas),
        comm_(w.comm),
        num_params_(w.params.size()) {
    const auto& layout = w.model.layout();
    // With a pipeline, a fragment syncs the part of it this stage holds (maybe nothing).
    const auto& stage = layout.stage();
    for (const auto& f : plan_) {
      std::vector<Range> r;
      for (int l : f.blocks)
        if (l >= stage.first_block && l < stage.last_block) r.push_back(layout.block_range(l));
      if (f.nonblock)
        for (const auto& x : layout.nonblock_ranges()) r.push_back(x);
      ranges_.push_back(merge_ranges(r));
    }
    std::string scratch;
    if (cfg.streaming.offload_outer) {
      make_dirs(cfg.train.out_dir);
      scratch = cfg.train.out_dir + "/outer-state-" + std::to_string(w.world_rank) + ".scratch";
    }
    store_ = std::make_unique<OuterStore>(ranges_, int64_t(num_params_), scratch);
    int64_t max_tau = tau_;
    if (!cfg.streaming.worker_tau.empty())
      for (int r = 0; r < w.replicas; ++r)
        max_tau = std::max(max_tau, worker_tau(cfg.streaming.tau, cfg.streaming.worker_tau, r, w.replicas));
    const int64_t gap = outer_.inner_steps / int64_t(plan_.size());
    if (plan_.size() > 1 && max_tau >= gap)
      fail("streaming.tau (" + std::to_string(max_tau) + ") must be smaller than H / fragments = " +
           std::to_string(outer_.inner_steps) + " / " + std::to_string(plan_.size()));
    if (plan_.size() == 1 && max_tau >= outer_.inner_steps)
      fail("streaming.tau (" + std::to_string(max_tau) + ") must be smaller than outer.inner_steps");
  }

  void start(Worker& w, bool resumed) override {
    if (!resumed) store_->write_all(w.params, std::vector<float>(num_params_, 0.0f));
  }

  void after_step(Worker& w, int64_t done, bool last) override {
    while (!pending_.empty() && (pending_.front().apply_at <= done || last)) {
      apply(w, pending_.front(), tau_ == 0);
      pending_.pop_front();
    }
    for (size_t j = 0; j < plan_.size(); ++j) {
      if (ranges_[j].empty()) continue;  // not on this pipeline stage
      const bool due = syncs_at(plan_[j], done, outer_.inner_steps);
      if (!due && !last) continue;
      begin_sync(w, j, done);
      // tau = 0, and the final synchronization of a run, wait at once and replace.
      if (tau_ == 0 || last) {
        apply(w, pending_.back(), true);
        pending_.pop_back();
      }
    }
  }

  const std::vector<float>& eval_params(Worker& w) override {
    if (cfg_.eval == "outer") {
      store_->read_params(eval_buffer_);
      return eval_buffer_;
    }
    eval_buffer_ = w.params;
    if (cfg_.eval == "average") {
      w.comm.all_reduce(eval_buffer_.data(), int64_t(eval_buffer_.size()), ReduceOp::Mean, "eval");
    } else {  // replica0
      std::string bytes(reinterpret_cast<const char*>(eval_buffer_.data()), eval_buffer_.size() * 4);
      auto h = w.comm.broadcast_start(&bytes, 0, "eval");
      w.comm.wait(h);
      std::memcpy(eval_buffer_.data(), bytes.data(), bytes.size());
    }
    return eval_buffer_;
  }

  void save_state(TrainingState& st) override {
    store_->read_all(st.tensors["outer.params"], st.tensors["outer.momentum"]);
    // Syncs in flight: completed (their averages stored) but not yet applied.
    std::string list;
    for (auto& p : pending_) {
      complete(p);
      const std::string key = "pending." + std::to_string(p.fragment);
      st.tensors[key + ".avg"] = p.avg;
      st.meta[key + ".apply_at"] = std::to_string(p.apply_at);
      list += (list.empty() ? "" : ",") + std::to_string(p.fragment);
    }
    st.meta["pending"] = list;
  }

  void load_state(const TrainingState& st) override {
    std::vector<float> theta(num_params_), momentum(num_params_);
    st.take("outer.params", theta);
    st.take("outer.momentum", momentum);
    store_->write_all(theta, momentum);
    pending_.clear();
    const auto it = st.meta.find("pending");
    if (it == st.meta.end() || it->second.empty()) return;
    std::stringstream ss(it->second);
    std::string item;
    while (std::getline(ss, item, ',')) {
      Pending p;
      p.fragment = size_t(std::stoul(item));
      if (p.fragment >= plan_.size()) fail("training state: pending fragment out of range");
      const std::string key = "pending." + item;
      p.apply_at = st.get_int(key + ".apply_at");
      p.avg.assign(size_t(total_size(ranges_[p.fragment])), 0.0f);
      st.take(key + ".avg", p.avg);
      p.completed = true;
      store_->read(p.fragment, p.theta, p.momentum);
      pending_.push_back(std::move(p));
    }
  }

  void report(nlohmann::json& out) const override {
    int64_t largest = 0;
    for (const auto& r : ranges_) largest = std::max(largest, total_size(r));
    out["fragments"] = int64_t(plan_.size());
    out["largest_fragment_params"] = largest;
    // Held for the whole run (all of it, or nothing when offloaded), plus what a sync in flight
    // holds: the fragment's outer parameters and momentum and the received average.
    out["outer_state_bytes"] = store_->resident_bytes() + 3 * largest * 4;
    out["outer_state_bytes_needed_at_once"] = 3 * largest * 4;
    out["outer_state_offloaded"] = store_->offloaded();
    out["tau"] = tau_;
  }

 private:
  struct Pending {
    size_t fragment = 0;
    int64_t apply_at = 0;
    Communicator::Handle handle;
    CountVectorAverage::Op op;           // fp32: the replicas' parameters, averaged per entry
    std::vector<float> buffer;           // codecs: this replica's delta
    std::vector<std::string> gathered;   // codecs: every replica's encoded delta
    std::vector<float> avg;              // the replicas' average parameters, once completed
    std::vector<float> theta, momentum;  // the fragment's outer state, packed
    bool completed = false;
  };

  void begin_sync(Worker& w, size_t j, int64_t step) {
    // The communication thread writes into the element, so it is placed first: references to
    // deque elements stay valid across push_back/pop_front.
    Pending& p = pending_.emplace_back();
    p.fragment = j;
    p.apply_at = step + tau_;
    store_->read(j, p.theta, p.momentum);
    const auto& ranges = ranges_[j];
    if (codec_->lossless()) {
      average_.start(w.comm, w.params.data(), ranges, p.op);
    } else {
      pack_ranges(w.params.data(), ranges, p.buffer);
      for (size_t k = 0; k < p.buffer.size(); ++k) p.buffer[k] = p.theta[k] - p.buffer[k];  // Delta_{m,j}
      Rng rng(mix_seed(seed_ ^ 0x57ea, uint64_t(w.rank), uint64_t(step) * 1024 + j));
      p.handle = w.comm.all_gather_start(codec_->encode(p.buffer.data(), int64_t(p.buffer.size()), rng), &p.gathered,
                                         "outer_gradients");
    }
  }

  // Waits for the reduction and computes the replicas' average parameters of the fragment.
  void complete(Pending& p) {
    if (p.completed) return;
    if (codec_->lossless()) {
      average_.finish(comm_, p.op, ranges_[p.fragment], p.avg);
    } else {
      comm_.wait(p.handle);
      std::vector<float> sum(p.buffer.size(), 0.0f);
      for (const auto& payload : p.gathered) codec_->decode_add(payload, sum.data(), int64_t(sum.size()));
      const float M = float(p.gathered.size());
      p.avg.resize(sum.size());
      for (size_t k = 0; k < sum.size(); ++k) p.avg[k] = p.theta[k] - sum[k] / M;
    }
    p.buffer.clear();
    p.gathered.clear();
    p.completed = true;
  }

  // Outer step on the fragment, then merge into (or replace) the replica's parameters.
  void apply(Worker& w, Pending& p, bool replace) {
    complete(p);
    outer_sgd_step(p.theta.data(), p.momentum.data(), p.avg.data(), int64_t(p.theta.size()), outer_);
    store_->write(p.fragment, p.theta, p.momentum);
    size_t k = 0;
    const float a = float(cfg_.alpha);
    for (const auto& r : ranges_[p.fragment]) {
      float* local = w.params.data() + r.begin;
      const float* synced = p.theta.data() + k;
      if (replace)
        std::copy(synced, synced + r.size(), local);
      else
        for (int64_t i = 0; i < r.size(); ++i) local[i] = a * local[i] + (1.0f - a) * synced[i];
      k += size_t(r.size());
    }
  }

  StreamingConfig cfg_;
  OuterConfig outer_;
  std::vector<FragmentPlan> plan_;
  std::vector<std::vector<Range>> ranges_;
  std::unique_ptr<Codec> codec_;
  int64_t tau_;
  uint64_t seed_;
  std::unique_ptr<OuterStore> store_;
  std::vector<float> eval_buffer_;
  std::deque<Pending> pending_;
  CountVectorAverage average_;
  Communicator& comm_;
  size_t num_params_;
};

}  // namespace

std::unique_ptr<Algorithm> make_streaming(const RunConfig& cfg, const Worker& w) {
  return std::make_unique<Streaming>(cfg, w);
}

}  // namespace loco
