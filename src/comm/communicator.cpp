#include "comm/communicator.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "core/interrupt.h"

namespace loco {

struct Communicator::Handle::State {
  std::string label;
  bool done = false;
  std::exception_ptr error;
};

Communicator::Communicator(std::shared_ptr<Transport> transport, CommOptions options,
                           std::shared_ptr<TraceRecorder> trace, int channel, std::shared_ptr<TrafficStats> traffic)
    : transport_(std::move(transport)),
      options_(options),
      trace_(trace ? std::move(trace) : std::make_shared<TraceRecorder>(false)),
      channel_(channel),
      rank_(transport_->rank()),
      size_(transport_->size()),
      traffic_(traffic ? std::move(traffic) : std::make_shared<TrafficStats>(options.peak_window_s)) {}

Communicator::~Communicator() { shutdown(); }

void Communicator::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Communicator::Handle Communicator::enqueue(const std::string& label, std::function<void()> body) {
  Handle h;
  h.state_ = std::make_shared<Handle::State>();
  h.state_->label = label;
  {
    std::lock_guard<std::mutex> lock(mu_);
    check(!stop_, "internal: operation \"" + label + "\" after the communicator was shut down");
    queue_.emplace_back(h.state_, std::move(body));
    // The thread starts with the first operation: communicators that are never used (a group
    // of one) cost no thread.
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  cv_.notify_all();
  return h;
}

void Communicator::loop() {
  for (;;) {
    std::pair<std::shared_ptr<Handle::State>, std::function<void()>> item;
    std::exception_ptr failed;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      failed = failed_;
    }
    std::exception_ptr error = failed;
    if (!error) {
      const double t0 = clock().now();
      op_bytes_sent_ = 0;
      try {
        item.second();
      } catch (...) {
        error = std::current_exception();
      }
      traffic_->record_instance(item.first->label, op_bytes_sent_);
      trace_->span(item.first->label, "communication", 1 + channel_, t0, clock().now());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      item.first->done = true;
      item.first->error = error;
      if (error && !failed_) failed_ = error;
    }
    done_cv_.notify_all();
  }
}

void Communicator::wait(Handle& h) {
  check(h.valid(), "internal: wait on an empty communication handle");
  const double t0 = clock().now();
  bool interrupt = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // Bounded: every operation's receives time out by themselves (network.timeout). An interrupt
    // (core/interrupt.h, asked every 50 ms outside the lock) aborts the run's communication, so
    // that the operation ends at once; it is waited for all the same (it writes into the
    // caller's buffers until then).
    while (!done_cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return h.state_->done; })) {
      if (interrupt) continue;
      lock.unlock();
      interrupt = interrupted();
      if (interrupt) abort("member " + std::to_string(rank_) + " was interrupted");
      lock.lock();
    }
  }
  const double t1 = clock().now();
  wait_seconds_ += t1 - t0;
  if (t1 > t0) trace_->span("wait " + h.state_->label, "wait", 0, t0, t1);
  auto err = h.state_->error;
  const std::string label = h.state_->label;
  h.state_.reset();
  if (interrupt) throw Interrupted("interrupted while waiting for the peers (" + label + ")");
  if (err) std::rethrow_exception(err);
}

bool Communicator::done(const Handle& h) const {
  std::lock_guard<std::mutex> lock(mu_);
  return h.state_ && h.state_->done;
}

void Communicator::send_msg(const std::string& op, int peer, std::string msg) {
  const int64_t bytes = int64_t(msg.size());
  const SendTiming t = transport_->send(peer, channel_, std::move(msg));
  traffic_->record_send(op, bytes, t.start, t.end);
  op_bytes_sent_ += bytes;
}

std::string Communicator::recv_msg(const std::string& op, int peer) {
  std::string msg = transport_->recv(peer, channel_, options_.timeout_s);
  traffic_->record_recv(op, int64_t(msg.size()));
  return msg;
}

namespace {
// This worker's position in a ring of `members` (empty: all `size` workers).
struct Ring {
  int size, index, left, right;
  int rank_of(int i) const { return members.empty() ? i : members[size_t(i)]; }
  std::vector<int> members;
};
Ring make_ring(int rank, int size, const std::vector<int>& members) {
  Ring r{size, rank, 0, 0, members};
  if (!members.empty()) {
    r.size = int(members.size());
    r.index = -1;
    for (int i = 0; i < r.size; ++i)
      if (members[size_t(i)] == rank) r.index = i;
    check(r.index >= 0, "group collective: worker " + std::to_string(rank) + " is not a member");
  }
  r.right = r.rank_of((r.index + 1) % r.size);
  r.left = r.rank_of((r.index + r.size - 1) % r.size);
  return r;
}
}  // namespace

namespace {
// Ring chunks are interleaved blocks: block j = [jQ, (j+1)Q) of the buffer belongs to chunk
// j mod M. The replica order in which an element is summed then depends only on its offset,
// not on the buffer's length, so equal tensors at equal offsets of different buffers (a tied
// embedding on the first and last pipeline stage) reduce to the same bits.
constexpr int64_t kRingBlock = 256;

// Each chunk travels in pieces of up to kRingPieceBlocks blocks (256 KiB), so that a worker
// forwards the first piece of a step while later ones are still arriving: the link stays busy
// across the ring's 2 (M-1) steps instead of idling for a latency at each. Smaller chunks are
// one piece (an empty chunk is one empty message).
constexpr int64_t kRingPieceBlocks = 256;

struct RingChunks {
  int64_t n;
  int M;
  int64_t blocks(int c) const {
    const int64_t all = (n + kRingBlock - 1) / kRingBlock;
    return c >= all ? 0 : (all - c + M - 1) / M;
  }
  int64_t pieces(int c) const { return std::max<int64_t>(1, (blocks(c) + kRingPieceBlocks - 1) / kRingPieceBlocks); }
  // Calls fn(offset, length) for every block of piece j of chunk c, in order (block k of chunk
  // c is [(c + kM) Q, (c + kM + 1) Q) of the buffer; the buffer's last block may be short).
  template <class Fn>
  void for_blocks(int c, int64_t j, Fn&& fn) const {
    const int64_t end = std::min(blocks(c), (j + 1) * kRingPieceBlocks);
    for (int64_t k = j * kRingPieceBlocks; k < end; ++k) {
      const int64_t b = (int64_t(c) + k * M) * kRingBlock;
      fn(b, std::min(kRingBlock, n - b));
    }
  }
  // Floats in blocks [k0, k1) of chunk c: whole blocks, but the buffer's last may be short.
  int64_t floats(int c, int64_t k0, int64_t k1) const {
    const int64_t all = (n + kRingBlock - 1) / kRingBlock;
    k1 = std::min(k1, blocks(c));
    if (k1 <= k0) return 0;
    const bool has_last = (all - 1) % M == c && k1 == blocks(c);
    return (k1 - k0) * kRingBlock - (has_last ? all * kRingBlock - n : 0);
  }
  int64_t size(int c, int64_t j) const { return floats(c, j * kRingPieceBlocks, (j + 1) * kRingPieceBlocks); }
  int64_t size(int c) const { return floats(c, 0, blocks(c)); }
  std::string pack(const float* data, int c, int64_t j) const {
    std::string out;  // appended, not zero-filled first: a large all-reduce packs every byte it sends
    out.reserve(size_t(size(c, j)) * sizeof(float));
    for_blocks(c, j, [&](int64_t b, int64_t len) {
      out.append(reinterpret_cast<const char*>(data + b), size_t(len) * sizeof(float));
    });
    return out;
  }
};
}  // namespace

int64_t ring_all_reduce_floats_sent(int64_t n, int M, int index) {
  if (M <= 1) return 0;
  const RingChunks chunks{n, M};
  // Reduce-scatter sends every chunk but (index + 1), the all-gather every chunk but (index + 2).
  return 2 * n - chunks.size((index + 1) % M) - chunks.size((index + 2) % M);
}

double ring_all_reduce_latency(int64_t n, int M, double bytes_per_s, double latency_s) {
  if (M <= 1) return 0;
  const RingChunks chunks{n, M};
  const double chunk = double(chunks.size(0)) * sizeof(float) / bytes_per_s;  // chunk 0 is the largest
  const double piece = double(chunks.size(0, 0)) * sizeof(float) / bytes_per_s;
  return latency_s + double(2 * M - 3) * std::max(0.0, latency_s + piece - chunk);
}

void Communicator::ring_all_reduce(float* data, int64_t n, ReduceOp op, const std::string& label,
                                   const std::vector<int>& members) {
  const Ring ring = make_ring(rank_, size_, members);
  const int M = ring.size, me = ring.index, right = ring.right, left = ring.left;
  if (M == 1) return;
  const RingChunks chunks{n, M};
  // Steps 0 .. M-2 reduce-scatter (after them this worker holds the full sum of chunk
  // (me + 1) mod M), steps M-1 .. 2M-3 all-gather the reduced chunks. The chunk sent at step
  // t + 1 is the one received at step t, piece by piece.
  const int T = 2 * (M - 1);
  auto send_c = [&](int t) { return t < M - 1 ? (me - t + 2 * M) % M : (me + 1 - (t - (M - 1)) + 2 * M) % M; };
  auto recv_c = [&](int t) { return t < M - 1 ? (me - t - 1 + 2 * M) % M : (me - (t - (M - 1)) + 2 * M) % M; };
  for (int64_t j = 0; j < chunks.pieces(send_c(0)); ++j) send_msg(label, right, chunks.pack(data, send_c(0), j));
  float block[kRingBlock];  // a received block, copied out of the message (which has no float alignment)
  for (int t = 0; t < T; ++t) {
    const int c = recv_c(t);
    for (int64_t j = 0; j < chunks.pieces(c); ++j) {
      const std::string in = recv_msg(label, left);
      if (int64_t(in.size()) != chunks.size(c, j) * int64_t(sizeof(float)))
        throw PeerError("all_reduce: worker " + std::to_string(left) + " sent " + std::to_string(in.size()) +
                            " bytes, expected " + std::to_string(chunks.size(c, j) * 4) +
                            " (mismatched buffers across workers)",
                        {left});
      const char* p = in.data();
      chunks.for_blocks(c, j, [&](int64_t b, int64_t len) {
        float* dst = data + b;
        const size_t bytes = size_t(len) * sizeof(float);
        if (t < M - 1) {
          std::memcpy(block, p, bytes);
          for (int64_t i = 0; i < len; ++i) dst[i] = block[i] + dst[i];
          if (t == M - 2 && op == ReduceOp::Mean)  // the chunk this worker owns is complete
            for (int64_t i = 0; i < len; ++i) dst[i] /= float(M);
        } else {
          std::memcpy(dst, p, bytes);
        }
        p += bytes;
      });
      if (t + 1 < T) send_msg(label, right, chunks.pack(data, c, j));
    }
  }
}

void Communicator::ring_all_gather(std::string payload, std::vector<std::string>* out, const std::string& label,
                                   const std::vector<int>& members) {
  const Ring ring = make_ring(rank_, size_, members);
  const int M = ring.size, me = ring.index;
  out->assign(size_t(M), std::string());
  (*out)[size_t(me)] = std::move(payload);
  for (int s = 0; s < M - 1; ++s) {
    const int send_i = (me - s + 2 * M) % M, recv_i = (me - s - 1 + 2 * M) % M;
    send_msg(label, ring.right, (*out)[size_t(send_i)]);
    (*out)[size_t(recv_i)] = recv_msg(label, ring.left);
  }
}

Communicator::Handle Communicator::all_reduce_group_start(float* data, int64_t n, ReduceOp op,
                                                          std::vector<int> members, const std::string& label) {
  make_ring(rank_, size_, members);  // validates membership now, in the caller's thread
  return enqueue(label, [=, this] { ring_all_reduce(data, n, op, label, members); });
}

void Communicator::ring_all_gather_floats(const float* data, const std::vector<int64_t>& counts,
                                          std::vector<float>* out, const std::string& label,
                                          const std::vector<int>& members) {
  const Ring ring = make_ring(rank_, size_, members);
  const int M = ring.size, me = ring.index;
  std::vector<int64_t> at(size_t(M) + 1, 0);  // where each member's floats go in out
  for (int k = 0; k < M; ++k) at[size_t(k) + 1] = at[size_t(k)] + counts[size_t(k)];
  out->resize(size_t(at[size_t(M)]));
  float* o = out->data();
  if (counts[size_t(me)] > 0) std::memcpy(o + at[size_t(me)], data, size_t(counts[size_t(me)]) * sizeof(float));
  constexpr int64_t P = kRingPieceBlocks * kRingBlock;  // floats per piece
  auto pieces = [&](int k) { return (counts[size_t(k)] + P - 1) / P; };
  auto piece = [&](int k, int64_t j) { return std::min(P, counts[size_t(k)] - j * P); };
  auto bytes = [&](int k, int64_t j) { return reinterpret_cast<const char*>(o + at[size_t(k)] + j * P); };
  if (M == 1) return;
  for (int64_t j = 0; j < pieces(me); ++j)
    send_msg(label, ring.right, std::string(bytes(me, j), size_t(piece(me, j)) * sizeof(float)));
  // Step s receives member (me - s - 1)'s floats from the left, piece by piece, and forwards
  // each piece to the right unless the right is where they came from.
  for (int s = 0; s < M - 1; ++s) {
    const int k = (me - s - 1 + 2 * M) % M;
    for (int64_t j = 0; j < pieces(k); ++j) {
      std::string in = recv_msg(label, ring.left);
      if (int64_t(in.size()) != piece(k, j) * int64_t(sizeof(float)))
        throw PeerError("all_gather: worker " + std::to_string(ring.left) + " sent " + std::to_string(in.size()) +
                            " bytes, expected " + std::to_string(piece(k, j) * 4) + " (member " +
                            std::to_string(ring.rank_of(k)) + "'s floats)",
                        {ring.left});
      std::memcpy(o + at[size_t(k)] + j * P, in.data(), in.size());
      if (s + 1 < M - 1) send_msg(label, ring.right, std::move(in));
    }
  }
}

Communicator::Handle Communicator::all_gather_floats_group_start(const float* data, std::vector<int64_t> counts,
                                                                 std::vector<float>* out,
                                                                 std::vector<int> members, const std::string& label) {
  const Ring ring = make_ring(rank_, size_, members);
  check(int(counts.size()) == ring.size, "all_gather_floats: one count per member");
  for (int64_t c : counts) check(c >= 0, "all_gather_floats: a count below 0");
  return enqueue(label, [=, this] { ring_all_gather_floats(data, counts, out, label, members); });
}

Communicator::Handle Communicator::all_reduce_start(float* data, int64_t n, ReduceOp op, const std::string& label) {
  return enqueue(label, [=, this] { ring_all_reduce(data, n, op, label); });
}

Communicator::Handle Communicator::all_gather_start(std::string payload, std::vector<std::string>* out,
                                                    const std::string& label) {
  return enqueue(label, [this, p = std::move(payload), out, label]() mutable { ring_all_gather(std::move(p), out, label); });
}

Communicator::Handle Communicator::broadcast_start(std::string* data, int root, const std::string& label) {
  check(root >= 0 && root < size_, "broadcast: root out of range");
  return enqueue(label, [=, this] {
    if (rank_ == root) {
      for (int p = 0; p < size_; ++p)
        if (p != root) send_msg(label, p, *data);
    } else {
      *data = recv_msg(label, root);
    }
  });
}

Communicator::Handle Communicator::send_start(int peer, std::string payload, const std::string& label) {
  check(peer >= 0 && peer < size_ && peer != rank_, "send: invalid peer " + std::to_string(peer));
  return enqueue(label, [this, peer, p = std::move(payload), label]() mutable { send_msg(label, peer, std::move(p)); });
}

Communicator::Handle Communicator::recv_start(int peer, std::string* out, const std::string& label) {
  check(peer >= 0 && peer < size_ && peer != rank_, "recv: invalid peer " + std::to_string(peer));
  return enqueue(label, [=, this] { *out = recv_msg(label, peer); });
}

Communicator::Handle Communicator::exchange_start(int peer, std::string payload, std::string* out,
                                                  const std::string& label) {
  check(peer >= 0 && peer < size_ && peer != rank_, "exchange: invalid peer " + std::to_string(peer));
  return enqueue(label, [this, peer, p = std::move(payload), out, label]() mutable {
    send_msg(label, peer, std::move(p));
    *out = recv_msg(label, peer);
  });
}

Communicator::Handle Communicator::all_gather_direct_start(std::string payload, std::vector<std::string>* out,
                                                           const std::string& label) {
  return enqueue(label, [this, p = std::move(payload), out, label]() mutable {
    for (int peer = 0; peer < size_; ++peer)
      if (peer != rank_) send_msg(label, peer, p);
    out->assign(size_t(size_), std::string());
    for (int peer = 0; peer < size_; ++peer) (*out)[size_t(peer)] = peer == rank_ ? p : recv_msg(label, peer);
  });
}

Communicator::Handle Communicator::reduce_scatter_gather_start(
    std::vector<std::string> shards, std::function<std::string(std::vector<std::string>&)> reduce,
    std::vector<std::string>* gathered, const std::string& label) {
  check(int(shards.size()) == size_, "internal: reduce_scatter_gather needs one shard per member");
  return enqueue(label, [this, shards = std::move(shards), reduce = std::move(reduce), gathered, label]() mutable {
    for (int peer = 0; peer < size_; ++peer)
      if (peer != rank_) send_msg(label, peer, std::move(shards[size_t(peer)]));
    std::vector<std::string> mine(static_cast<size_t>(size_));
    for (int peer = 0; peer < size_; ++peer)
      mine[size_t(peer)] = peer == rank_ ? std::move(shards[size_t(rank_)]) : recv_msg(label, peer);
    std::string reduced = reduce(mine);
    for (int peer = 0; peer < size_; ++peer)
      if (peer != rank_) send_msg(label, peer, reduced);
    gathered->assign(size_t(size_), std::string());
    for (int peer = 0; peer < size_; ++peer)
      (*gathered)[size_t(peer)] = peer == rank_ ? reduced : recv_msg(label, peer);
  });
}

Communicator::Handle Communicator::barrier_start() {
  auto out = std::make_shared<std::vector<std::string>>();
  return enqueue("barrier", [this, out] { ring_all_gather(std::string(), out.get(), "barrier"); });
}

void Communicator::all_reduce(float* data, int64_t n, ReduceOp op, const std::string& label) {
  auto h = all_reduce_start(data, n, op, label);
  wait(h);
}

std::vector<std::string> Communicator::all_gather(std::string payload, const std::string& label) {
  std::vector<std::string> out;
  auto h = all_gather_start(std::move(payload), &out, label);
  wait(h);
  return out;
}

void Communicator::barrier() {
  auto h = barrier_start();
  wait(h);
}

std::vector<double> Communicator::sum_doubles(const std::vector<double>& values, const std::string& label) {
  const size_t bytes = values.size() * sizeof(double);
  std::string payload(bytes, '\0');
  if (bytes) std::memcpy(payload.data(), values.data(), bytes);
  const auto all = all_gather(std::move(payload), label);
  std::vector<double> sum(values.size(), 0.0);
  for (const auto& p : all) {
    if (p.size() != bytes) fail(label + ": mismatched value counts across workers");
    for (size_t i = 0; i < values.size(); ++i) {
      double v;
      std::memcpy(&v, p.data() + i * sizeof(double), sizeof(double));
      sum[i] += v;
    }
  }
  return sum;
}

void Communicator::abort(const std::string& reason) { transport_->abort(reason); }

}  // namespace loco
