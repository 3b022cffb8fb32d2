// Streaming DiLoCo's syncs, fragment by fragment (algo/streaming.cpp has the schedule, the merges
// and the state): a sync's start (the outer gradient, made piece by piece as the codec encodes it,
// or the parameters averaged in fp32; screening and robust rules), its completion (the members'
// payloads decoded, the average and, when due, the outer step in the same pass) and the buffers
// its passes reuse. With an in-memory store the fragment's outer state is read where it is kept
// (Pending::in_store).
#include "algo/streaming.h"

#include <algorithm>
#include <iostream>
#include <utility>

#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"

namespace loco {

namespace {

// out = theta - x over n entries (an outer gradient).
void difference(const float* __restrict theta, const float* __restrict x, float* __restrict out, int64_t n) {
  for (int64_t k = 0; k < n; ++k) out[k] = theta[k] - x[k];
}

// f(o, x, m) over packed entries [b, b + len) of a fragment, part by part: o the part's offset
// from b, x its first entry in the flat buffer, m its length. segs: the fragment's segments
// (Streaming::segments_), whose packed offsets rise with them.
template <class Segments, class F>
void each_part(const Segments& segs, int64_t b, int64_t len, F f) {
  auto s = std::upper_bound(segs.begin(), segs.end(), b, [](int64_t v, const auto& x) { return v < x.packed; }) - 1;
  for (int64_t o = 0; o < len; ++s) {
    const int64_t off = b + o - s->packed, m = std::min(len - o, s->end - s->begin - off);
    f(o, s->begin + off, m);
    o += m;
  }
}

// A completed sync's pass over n entries: the average parameters a = theta - d / M (d the
// decoded sum of the outer gradients, M the divisor), kept in avg, or the outer step from there
// (a not kept: a checkpoint computes it again, Streaming::stepped_average). Functions of their
// own with restrict-qualified buffers, so that the loops vectorize.
struct OuterStepArgs {
  float M, mu, lr;
  bool nesterov;
};

void average_only(const float* __restrict theta, const float* __restrict d, float* __restrict avg, int64_t n,
                  const OuterStepArgs& s) {
  for (int64_t k = 0; k < n; ++k) avg[k] = theta[k] - d[k] / s.M;
}

// The outer state stepped in place.
void average_and_step(float* __restrict theta, float* __restrict mom, const float* __restrict d, int64_t n,
                      const OuterStepArgs& s) {
  for (int64_t k = 0; k < n; ++k) outer_sgd_entry(theta[k], mom[k], theta[k] - d[k] / s.M, s.mu, s.lr, s.nesterov);
}

// The new outer state into theta1 and mom1, theta and mom left as they are.
void average_and_step_into(const float* __restrict theta, const float* __restrict mom, const float* __restrict d,
                           float* __restrict theta1, float* __restrict mom1, int64_t n, const OuterStepArgs& s) {
  for (int64_t k = 0; k < n; ++k) {
    float t = theta[k], m = mom[k];
    outer_sgd_entry(t, m, t - d[k] / s.M, s.mu, s.lr, s.nesterov);
    theta1[k] = t;
    mom1[k] = m;
  }
}

// The same, the new outer parameters written into out too (a caller's buffer,
// Streaming::prepare_merges).
void average_and_step_into_and(const float* __restrict theta, const float* __restrict mom, const float* __restrict d,
                               float* __restrict theta1, float* __restrict mom1, float* __restrict out, int64_t n,
                               const OuterStepArgs& s) {
  for (int64_t k = 0; k < n; ++k) {
    float t = theta[k], m = mom[k];
    outer_sgd_entry(t, m, t - d[k] / s.M, s.mu, s.lr, s.nesterov);
    theta1[k] = t;
    mom1[k] = m;
    out[k] = t;
  }
}

// Without `step`, avg = theta - d / M over n entries; with it the outer step, in place (theta,
// mom), or into theta1 and mom1 (and out) when given.
void average_entries(float* theta, float* mom, const float* d, float* avg, float* theta1, float* mom1, float* out,
                     int64_t n, bool step, const OuterStepArgs& s) {
  if (!step)
    average_only(theta, d, avg, n, s);
  else if (!theta1)
    average_and_step(theta, mom, d, n, s);
  else if (!out)
    average_and_step_into(theta, mom, d, theta1, mom1, n, s);
  else
    average_and_step_into_and(theta, mom, d, theta1, mom1, out, n, s);
}

}  // namespace

std::vector<float> Streaming::take_spare(int64_t n) {
  // The smallest vector that holds n values, else the largest (grown here).
  auto better = [n](const std::vector<float>& a, const std::vector<float>& b) {
    const bool a_fits = int64_t(a.capacity()) >= n, b_fits = int64_t(b.capacity()) >= n;
    if (a_fits != b_fits) return a_fits;
    return a_fits ? a.capacity() < b.capacity() : a.capacity() > b.capacity();
  };
  std::vector<float> v;
  const auto best = std::min_element(spare_.begin(), spare_.end(), better);
  if (best != spare_.end()) {
    v = std::move(*best);
    spare_.erase(best);
  }
  v.resize(size_t(n));
  return v;
}

void Streaming::give_spare(std::vector<float>& v) {
  if (v.capacity() == 0) return;
  constexpr size_t kMostSpare = 6;  // about what the syncs in flight with tau 1 to 2 hold
  if (spare_.size() >= kMostSpare) {
    auto smallest = std::min_element(spare_.begin(), spare_.end(),
                                     [](const auto& a, const auto& b) { return a.capacity() < b.capacity(); });
    if (smallest->capacity() >= v.capacity()) {
      v = std::vector<float>();
      return;
    }
    spare_.erase(smallest);
  }
  spare_.push_back(std::move(v));
  v = std::vector<float>();
}

// Ahead of the merge: p.theta and p.momentum were read from the store when the sync began, and
// nothing else writes the fragment's outer state before its merge (tau < H), so stepping them
// here and writing them back at the merge is what apply() would do then. A checkpoint taken in
// between saves the average (p.avg, or for a codec's sync stepped_average()) and the store's
// values, as before the step.
// The caller's buffers (synced) are written by the completion's pass that steps from the store,
// else copied from the new outer parameters after it.
void Streaming::prepare_merges(const std::map<size_t, SyncedBuffer>& synced) {
  if (elastic_) {
    check(synced.empty(), "internal: prepare_merges given buffers in an elastic run");
    return;
  }
  // The buffers are the caller's for this call only: none is kept past it, whatever is thrown.
  struct Forget {
    std::deque<Pending>& pending;
    ~Forget() {
      for (auto& p : pending) p.synced_out = nullptr;
    }
  } forget{pending_};
  for (const auto& [j, b] : synced) {
    auto p = std::find_if(pending_.begin(), pending_.end(), [j = j](const Pending& q) { return q.fragment == j; });
    check(!held_ && caller_mixes_ && p != pending_.end() && !p->peeked,
          "internal: prepare_merges given a buffer for fragment " + std::to_string(j) + ", not one of merges_ahead()'s");
    check(b.n == total_size(ranges_[j]), "internal: prepare_merges: fragment " + std::to_string(j) + " has " +
                                             std::to_string(total_size(ranges_[j])) + " values, its buffer " +
                                             std::to_string(b.n));
    p->synced_out = b.data;
  }
  if (!unwritten_.empty()) written_store();
  for (auto& p : pending_) {
    complete(comm_, p, held_ ? Step::none : Step::ahead);
    if (!held_) step_outer(p);  // when completed before (a codec's completion takes it too)
    if (p.synced_out) {  // not written by the completion's pass
      const float* from = p.theta.data();
      float* to = p.synced_out;
      each_index(int64_t(p.theta.size()), [=](int64_t i) { to[i] = from[i]; });
    }
  }
}

std::vector<size_t> Streaming::merges_ahead() const {
  std::vector<size_t> out;
  if (elastic_ || !caller_mixes_) return out;
  for (const auto& p : pending_)
    if (!p.peeked) out.push_back(p.fragment);
  return out;
}

bool Streaming::mix_merges_elsewhere() {
  caller_mixes_ = !held_;  // a caller holding the outer state merges everything itself
  return caller_mixes_;
}

void Streaming::read_outer_state(Pending& p) {
  if (!p.in_store) return;
  const int64_t n = total_size(ranges_[p.fragment]);
  p.theta = take_spare(n);
  p.momentum = take_spare(n);
  store().read(p.fragment, p.theta, p.momentum);
  p.in_store = false;
}

void Streaming::average_packed(Pending& p, const float* d, int64_t b, int64_t len, Step step, float M) const {
  const OuterStepArgs s{M, float(outer_.momentum), float(outer_.lr), outer_.nesterov};
  float* avg = step == Step::none ? p.avg.data() + b : nullptr;
  if (!p.in_store) {  // packed: stepped in place, if at all
    average_entries(p.theta.data() + b, p.momentum.data() + b, d, avg, nullptr, nullptr, nullptr, len,
                    step != Step::none, s);
    return;
  }
  float* theta = store().resident_theta(p.fragment) + b;
  float* mom = store().resident_momentum(p.fragment) + b;
  const bool ahead = step == Step::ahead;  // into p.theta and p.momentum, the store's left as it is
  average_entries(theta, mom, d, avg, ahead ? p.theta.data() + b : nullptr, ahead ? p.momentum.data() + b : nullptr,
                  ahead && p.synced_out ? p.synced_out + b : nullptr, len, step != Step::none, s);
}

void Streaming::complete_encoded(Pending& p, Step step) {
  const int64_t n = total_size(ranges_[p.fragment]);
  if (step == Step::none) p.avg = take_spare(n);  // else not kept (stepped_average)
  if (p.in_store && step == Step::ahead) {
    p.theta = take_spare(n);
    p.momentum = take_spare(n);
  }
  // The decoded sum d of the members' outer gradients, then in one pass the mean (d / M, as
  // decode_mean), the average parameters theta - mean and, when it is due now, the outer step;
  // each entry's operations as apart. Decoded piece by piece into the cache where the codec
  // decodes ranges of a payload, else whole. The pieces lie within shards: with the all-gather
  // one, the fragment, whose payloads are every member's (their sum divided by M); with the
  // reduce-scatter member k's shard, whose one payload is already the mean.
  const int64_t align = codec_->range_alignment();
  if (align > 0) {
    const bool gather = p.reduce == EncodedReduce::AllGather;
    const int S = gather ? 1 : int(p.gathered.size());
    auto shard = [&](int k) { return std::pair(shard_begin(n, S, k), shard_begin(n, S, k + 1)); };
    for (int k = 0; k < int(p.gathered.size()); ++k) {  // every payload checked before anything is written
      const auto [b, e] = shard(gather ? 0 : k);
      codec_->check_payload(p.gathered[size_t(k)], e - b);
    }
    const float M = gather ? float(p.gathered.size()) : 1.0f;
    const int64_t piece = std::max<int64_t>(1, (int64_t(1) << 12) / align) * align;
    struct Piece {
      int64_t begin, len;
      int shard;
    };
    std::vector<Piece> pieces;
    for (int k = 0; k < S; ++k)
      for (auto [b, e] = shard(k); b < e; b += piece) pieces.push_back({b, std::min(piece, e - b), k});
    parallel_for(int64_t(pieces.size()), std::max<int64_t>(1, (int64_t(1) << 16) / piece), [&](int64_t q0, int64_t q1) {
      std::vector<float> d(size_t(std::min(n, piece)));
      for (int64_t q = q0; q < q1; ++q) {
        const Piece& c = pieces[size_t(q)];
        std::fill(d.begin(), d.begin() + c.len, 0.0f);
        if (gather) {
          for (const auto& payload : p.gathered) codec_->decode_add_range(payload, n, c.begin, c.len, d.data());
        } else {
          const auto [b, e] = shard(c.shard);
          codec_->decode_add_range(p.gathered[size_t(c.shard)], e - b, c.begin - b, c.len, d.data());
        }
        average_packed(p, d.data(), c.begin, c.len, step, M);
      }
    });
  } else {
    std::vector<float> delta = take_spare(n);
    float* d = delta.data();
    each_index(n, [=](int64_t k) { d[k] = 0.0f; });
    const float M = decode_sum(p, delta);
    parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) { average_packed(p, d + b, b, e - b, step, M); });
    give_spare(delta);
  }
  if (step != Step::none) {
    if (p.in_store && step == Step::ahead) p.synced_out = nullptr;  // written by the pass
    if (p.in_store) p.in_store = step == Step::in_place;  // else the new state is in p.theta and p.momentum
    p.stepped = true;
    p.avg_from_payloads = true;
  }
}

std::vector<float> Streaming::stepped_average(const Pending& p) {
  // The completion's pass without the step, over the fragment's outer parameters before it: the
  // store's (written at the merge only), read in place or, offloaded, into a buffer of its own.
  Pending q;
  q.fragment = p.fragment;
  q.reduce = p.reduce;
  q.gathered = p.gathered;
  q.in_store = store().resident();
  if (!q.in_store) store().read(p.fragment, q.theta, q.momentum);
  complete_encoded(q, Step::none);
  return std::move(q.avg);
}

void Streaming::step_outer(Pending& p) {
  if (p.stepped) return;
  read_outer_state(p);
  outer_sgd_step(p.theta.data(), p.momentum.data(), p.avg.data(), int64_t(p.theta.size()), outer_);
  p.stepped = true;
}

float Streaming::decode_sum(const Pending& p, std::vector<float>& delta) const {
  const int64_t n = int64_t(delta.size());
  if (p.reduce == EncodedReduce::AllGather) {
    for (const auto& payload : p.gathered) codec_->decode_add(payload, delta.data(), n);
    return float(p.gathered.size());
  }
  const int M = int(p.gathered.size());
  for (int k = 0; k < M; ++k) {
    const int64_t b = shard_begin(n, M, k);
    codec_->decode_add(p.gathered[size_t(k)], delta.data() + b, shard_begin(n, M, k + 1) - b);
  }
  return 1.0f;  // each shard is already its mean
}

void Streaming::decode_mean(const Pending& p, std::vector<float>& delta) const {
  const float M = decode_sum(p, delta);
  if (M == 1.0f) return;
  float* d = delta.data();
  each_index(int64_t(delta.size()), [=](int64_t k) { d[k] /= M; });
}

void Streaming::begin_sync(Communicator& comm, int rank, int replicas, const std::vector<float>& params, size_t j,
                           int64_t step, Pending& p) {
  p.fragment = j;
  p.apply_at = step + tau_;
  if (held_) {
    begin_held_sync(comm, rank, replicas, params, uint64_t(step) * 1024 + j, p);
    return;
  }
  const auto& ranges = ranges_[j];
  const int64_t size = total_size(ranges);
  OuterStore& st = written_store();  // first: the buffers of the merges written back become spare
  // A codec's sync reads the outer state only for the outer gradient and the outer step: from
  // an in-memory store, in place (the fragment's values there change only at its merge).
  p.in_store = !robust_ && !elastic_ && !codec_->lossless() && fault_.kind == Fault::Kind::None && st.resident();
  if (!p.in_store) {
    p.theta = take_spare(size);
    p.momentum = take_spare(size);
    st.read(j, p.theta, p.momentum);
  }
  const uint64_t stream = uint64_t(step) * 1024 + j;
  const uint64_t fault_seed = mix_seed(seed_ ^ 0xfa17, uint64_t(rank), stream);
  if (robust_) {
    begin_robust_sync(comm, params, stream, fault_seed, p);
    return;
  }
  if (codec_->lossless()) {
    if (fault_.kind == Fault::Kind::None) {
      average_.start(comm, params.data(), ranges, p.op);
      return;
    }
    pack_ranges(params.data(), ranges, p.buffer);
    apply_fault(fault_, p.apply_at - tau_, p.theta, p.buffer, fault_seed);
    faulty_params_ = params;
    unpack_ranges(p.buffer.data(), ranges, faulty_params_.data());
    average_.start(comm, faulty_params_.data(), ranges, p.op);
    return;
  }
  // Delta_{m,j} = theta - params, packed: made piece by piece as the codec encodes it, straight
  // from the parameters' ranges, or, with a fault, from the packed parameters corrupted first.
  Codec::Fill fill;
  const float* theta = p.in_store ? st.resident_theta(j) : p.theta.data();  // packed
  if (fault_.kind == Fault::Kind::None) {
    fill = [&segs = segments_[j], theta, x = params.data()](int64_t b, int64_t len, float* out) {
      each_part(segs, b, len, [&](int64_t o, int64_t at, int64_t m) { difference(theta + b + o, x + at, out + o, m); });
    };
  } else {
    p.buffer = take_spare(size);
    pack_ranges(params.data(), ranges, p.buffer);
    apply_fault(fault_, p.apply_at - tau_, p.theta, p.buffer, fault_seed);
    fill = [theta, x = p.buffer.data()](int64_t b, int64_t len, float* out) {
      difference(theta + b, x + b, out, len);
    };
  }
  Rng rng(mix_seed(seed_ ^ 0x57ea, uint64_t(rank), stream));
  p.reduce = last_reduce_ = choose_encoded_reduce(reduce_setting_, replicas);
  const int M = p.reduce == EncodedReduce::AllGather ? 1 : replicas;
  // A codec that takes the values whole gets them in a spare buffer (encode_from would make one
  // anew, and a fresh fragment-sized buffer costs the kernel a page fault per 4 KiB).
  std::vector<float> whole;
  if (!codec_->encodes_pieces()) {
    whole = take_spare(size);
    parallel_for(size, 1 << 16, [&](int64_t b, int64_t e) { fill(b, e - b, whole.data() + b); });
  }
  std::vector<std::string> payloads;
  for (int k = 0; k < M; ++k) {
    const int64_t b = shard_begin(size, M, k), len = shard_begin(size, M, k + 1) - b;
    payloads.push_back(whole.empty() ? codec_->encode_from(len, [&](int64_t at, int64_t m, float* out) { fill(b + at, m, out); }, rng)
                                     : codec_->encode(whole.data() + b, len, rng));
  }
  give_spare(whole);
  give_spare(p.buffer);
  start_encoded(comm, rank, replicas, std::move(payloads), stream, p);
}

void Streaming::start_encoded(Communicator& comm, int rank, int replicas, std::vector<std::string> payloads,
                              uint64_t stream, Pending& p) {
  if (p.reduce == EncodedReduce::AllGather) {
    p.handle = comm.all_gather_start(std::move(payloads[0]), &p.gathered, "outer_gradients");
    return;
  }
  // Shard `me` of every replica: decoded, summed in float32 in replica order, averaged and
  // encoded again (on the communication thread).
  const int M = replicas, me = rank;
  const int64_t n = total_size(ranges_[p.fragment]);
  const int64_t len = shard_begin(n, M, me + 1) - shard_begin(n, M, me);
  const Codec* codec = codec_.get();
  const uint64_t reseed = mix_seed(seed_ ^ 0x5ca7, uint64_t(me), stream);
  auto reduce = [codec, len, M, reseed](std::vector<std::string>& received) {
    std::vector<float> sum(size_t(len), 0.0f);
    for (const auto& payload : received) codec->decode_add(payload, sum.data(), len);
    for (auto& x : sum) x /= float(M);
    Rng r(reseed);
    return codec->encode(sum.data(), len, r);
  };
  p.handle = comm.reduce_scatter_gather_start(std::move(payloads), reduce, &p.gathered, "outer_gradients");
}

void Streaming::begin_held_sync(Communicator& comm, int rank, int replicas, const std::vector<float>& params,
                                uint64_t stream, Pending& p) {
  const auto& ranges = ranges_[p.fragment];
  if (codec_->lossless()) {
    if (replicas == 1) {
      p.own = true;
      return;
    }
    average_.start(comm, params.data(), ranges, p.op);
    return;
  }
  auto it = provided_.find(p.fragment);
  check(it != provided_.end(), "internal: fragment " + std::to_string(p.fragment) +
                                   "'s sync started without the encoded outer gradient from the caller");
  std::vector<std::string> payloads = std::move(it->second);
  provided_.erase(it);
  const int64_t n = total_size(ranges);
  p.reduce = last_reduce_ = choose_encoded_reduce(reduce_setting_, replicas);
  const int M = p.reduce == EncodedReduce::AllGather ? 1 : replicas;
  check(int(payloads.size()) == M, "the caller's encoded outer gradient has " + std::to_string(payloads.size()) +
                                       " payloads, expected " + std::to_string(M));
  for (int k = 0; k < M; ++k) codec_->check_payload(payloads[size_t(k)], shard_begin(n, M, k + 1) - shard_begin(n, M, k));
  start_encoded(comm, rank, replicas, std::move(payloads), stream, p);
}

void Streaming::begin_robust_sync(Communicator& comm, const std::vector<float>& params, uint64_t stream,
                                  uint64_t fault_seed, Pending& p) {
  p.robust = true;
  pack_ranges(params.data(), ranges_[p.fragment], p.buffer);  // this member's parameters of the fragment
  apply_fault(fault_, p.apply_at - tau_, p.theta, p.buffer, fault_seed);
  const int64_t n = int64_t(p.buffer.size());
  if (codec_->lossless() && aggregate_.rule == "mean") {
    p.reduce = EncodedReduce::AllGather;
    p.screening = exchange_norms(comm, outer_gradient_norm(p.theta.data(), p.buffer.data(), n), aggregate_.reject_norm,
                                 "outer_gradients", bounds(p));
    const bool none = p.screening.rejected.empty();
    if (std::binary_search(p.screening.rejected.begin(), p.screening.rejected.end(), comm.rank()))
      std::fill(p.buffer.begin(), p.buffer.end(), 0.0f);
    p.handle = comm.all_reduce_start(p.buffer.data(), n, none ? ReduceOp::Mean : ReduceOp::Sum, "outer_gradients");
    return;
  }
  for (int64_t k = 0; k < n; ++k) p.buffer[size_t(k)] = p.theta[size_t(k)] - p.buffer[size_t(k)];  // Delta_{m,j}
  Rng rng(mix_seed(seed_ ^ 0x57ea, uint64_t(comm.rank()), stream));
  p.reduce = last_reduce_ = EncodedReduce::AllGather;
  p.handle = comm.all_gather_direct_start(codec_->encode(p.buffer.data(), n, rng), &p.gathered, "outer_gradients");
}

ScreenBounds Streaming::bounds(const Pending& p) const {
  if (!aggregate_.screen) return {};
  return norm_history_[p.fragment].bounds(aggregate_.reject_norm, vector_norm(p.theta.data(), int64_t(p.theta.size())));
}

void Streaming::complete_robust(Communicator& comm, Pending& p) {
  comm.wait(p.handle);
  const int64_t n = int64_t(p.buffer.size());
  const int M = comm.size();
  p.avg.resize(size_t(n));
  if (p.gathered.empty()) {  // the screened mean: the accepted members' sum (or, with nobody rejected, mean)
    const int count = M - int(p.screening.rejected.size());
    for (int64_t k = 0; k < n; ++k)
      p.avg[size_t(k)] = p.screening.rejected.empty() ? p.buffer[size_t(k)] : p.buffer[size_t(k)] / float(count);
  } else {
    check_payloads(p.gathered, size_t(codec_->encoded_bytes(n)), "outer_gradients", "its encoded outer gradient");
    std::vector<std::vector<float>> deltas(static_cast<size_t>(M));
    std::vector<const float*> ptrs(static_cast<size_t>(M));
    std::vector<double> norms(static_cast<size_t>(M));
    for (int m = 0; m < M; ++m) {
      deltas[size_t(m)].assign(size_t(n), 0.0f);
      codec_->decode_add(p.gathered[size_t(m)], deltas[size_t(m)].data(), n);
      p.gathered[size_t(m)] = std::string();
      ptrs[size_t(m)] = deltas[size_t(m)].data();
      norms[size_t(m)] = vector_norm(ptrs[size_t(m)], n);
    }
    std::vector<float> delta(static_cast<size_t>(n));
    p.screening = screen_and_aggregate(ptrs, n, norms, aggregate_, delta.data(), "outer_gradients", bounds(p));
    for (int64_t k = 0; k < n; ++k) p.avg[size_t(k)] = p.theta[size_t(k)] - delta[size_t(k)];
  }
  if (aggregate_.screen) norm_history_[p.fragment].record(p.screening);
  rejected_ = int(p.screening.rejected.size());
  if (rejected_ && comm.rank() == 0)
    std::cerr << "loco: warning: fragment " << p.fragment << "'s sync, left out: "
              << describe_rejections(p.screening, noun_) << "\n";
}

void Streaming::complete(Communicator& comm, Pending& p, Step step) {
  if (p.completed) return;
  if (held_) {  // the caller decodes the payloads (checked here first)
    if (!p.own && codec_->lossless()) {
      average_.finish(comm, p.op, ranges_[p.fragment], p.avg);
    } else if (!p.own) {
      comm.wait(p.handle);
      const int64_t n = total_size(ranges_[p.fragment]);
      const int M = int(p.gathered.size());
      for (int k = 0; k < M; ++k) {
        const int64_t len = p.reduce == EncodedReduce::AllGather ? n : shard_begin(n, M, k + 1) - shard_begin(n, M, k);
        try {
          codec_->check_payload(p.gathered[size_t(k)], len);
        } catch (const Error& e) {
          throw PeerError(std::string("outer_gradients: member ") + std::to_string(k) + " sent " + e.what(), {k});
        }
      }
    }
    p.completed = true;
    return;
  }
  if (p.robust) {
    complete_robust(comm, p);
  } else if (codec_->lossless()) {
    average_.finish(comm, p.op, ranges_[p.fragment], p.avg);
  } else {
    comm.wait(p.handle);
    complete_encoded(p, step);
  }
  give_spare(p.buffer);
  if (!p.avg_from_payloads) p.gathered.clear();
  p.completed = true;
}

}  // namespace loco
