#pragma once
// Collectives and point-to-point operations of one worker, executed in issue order by a
// background communication thread so that they overlap with compute: *_start() returns at
// once, wait() blocks until the operation is done. Every worker must issue the same
// collectives in the same order. Built on Transport messages only:
//  - all_reduce: ring reduce-scatter + all-gather over M chunks made of interleaved blocks of
//    256 floats (block j in chunk j mod M); chunk c is summed in the fixed ring order
//    (x_c + x_{c+1}) + ..., so results are deterministic, identical on every backend, and an
//    element's order depends only on its offset; each worker sends about 2 (M-1)/M of the
//    buffer;
//  - all_gather (variable-size payloads): ring, M-1 messages per worker;
//  - broadcast: the root sends to every other worker;
//  - send / recv / exchange (paired send+recv with one peer); barrier.
// Every wait on a peer is bounded by the transport's timeout; a failed operation fails every
// later one with the same error.
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/stats.h"
#include "comm/transport.h"

namespace loco {

enum class ReduceOp { Sum, Mean };

// Floats that member `index` of an M-member ring all-reduce of n floats sends: every chunk but
// two (about 2 (M-1)/M of n).
int64_t ring_all_reduce_floats_sent(int64_t n, int M, int index);
// A ring all-reduce's time beyond its transfer time (the bytes a worker sends over its link's
// rate), on links of `bytes_per_s` with one-way `latency_s`. Chunks travel in pieces that are
// forwarded as they arrive, so a step waits for the latency only where a chunk takes less time
// to send than a latency plus one piece: L + (2M - 3) max(0, L + piece - chunk) in seconds
// (2 (M-1) L for chunks of one piece, L for large ones).
double ring_all_reduce_latency(int64_t n, int M, double bytes_per_s, double latency_s);

struct CommOptions {
  double timeout_s = 60;
  double peak_window_s = 1;
};

class Communicator {
 public:
  class Handle {
   public:
    Handle() = default;
    bool valid() const { return state_ != nullptr; }

   private:
    friend class Communicator;
    struct State;
    std::shared_ptr<State> state_;
  };

  // Operations run on `channel` of `transport`; traffic is counted into `traffic` (shared by
  // the communicators of one worker) or into counters of this communicator's own.
  Communicator(std::shared_ptr<Transport> transport, CommOptions options, std::shared_ptr<TraceRecorder> trace,
               int channel = kControlChannel, std::shared_ptr<TrafficStats> traffic = nullptr);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Clock& clock() const { return transport_->clock(); }

  // Buffers must stay valid and untouched until wait() returns.
  Handle all_reduce_start(float* data, int64_t n, ReduceOp op, const std::string& label = "all_reduce");
  Handle all_gather_start(std::string payload, std::vector<std::string>* out,
                          const std::string& label = "all_gather");
  Handle broadcast_start(std::string* data, int root, const std::string& label = "broadcast");
  Handle send_start(int peer, std::string payload, const std::string& label = "send");
  Handle recv_start(int peer, std::string* out, const std::string& label = "recv");
  Handle exchange_start(int peer, std::string payload, std::string* out, const std::string& label = "exchange");
  // All-gather of small payloads in one round: each worker sends its payload straight to every
  // other (the latency of one message instead of M-1, at (M-1) payloads sent per worker).
  Handle all_gather_direct_start(std::string payload, std::vector<std::string>* out,
                                 const std::string& label = "all_gather");
  // For payloads that cannot be summed on the wire (quantized): member k receives shards[k] of
  // every member (its own included), `reduce` turns those payloads (member order) into k's
  // reduced payload, then every member receives every member's reduced payload in `gathered`
  // (member order). reduce runs on the communication thread. Sent directly, in two rounds:
  // M-1 shards and M-1 copies of the reduced payload per worker.
  Handle reduce_scatter_gather_start(std::vector<std::string> shards,
                                     std::function<std::string(std::vector<std::string>&)> reduce,
                                     std::vector<std::string>* gathered, const std::string& label);
  Handle barrier_start();
  // The same ring collectives among a group of workers: `members` lists ascending ranks and
  // includes this one; only the members call it, in the same order as their other operations.
  // all_gather_floats_group_start: members[i] contributes counts[i] floats (this worker's read
  // from data when the operation runs, after the operations started before it, so that it can
  // forward the result of a previous reduction); out becomes members[0]'s floats, then
  // members[1]'s, ... (resized, its capacity kept: no new allocation from one call to the next).
  // Sent in pieces of 256 KiB, each forwarded as it arrives and checked against the counts (a
  // worker that sends another size fails the operation, blamed).
  Handle all_reduce_group_start(float* data, int64_t n, ReduceOp op, std::vector<int> members,
                                const std::string& label = "all_reduce");
  Handle all_gather_floats_group_start(const float* data, std::vector<int64_t> counts, std::vector<float>* out,
                                       std::vector<int> members, const std::string& label = "all_gather");
  // Blocks until the operation is done (time blocked is accounted as communication wait);
  // rethrows its error.
  void wait(Handle& h);
  bool done(const Handle& h) const;

  void all_reduce(float* data, int64_t n, ReduceOp op, const std::string& label = "all_reduce");
  std::vector<std::string> all_gather(std::string payload, const std::string& label = "all_gather");
  void barrier();
  // Sum of per-worker values, in rank order (for metrics; small).
  std::vector<double> sum_doubles(const std::vector<double>& values, const std::string& label = "metrics");

  // Stops every worker of the run (those blocked on this one fail with `reason`).
  void abort(const std::string& reason);
  // Runs the queued operations to their end (after an abort they fail at once) and joins the
  // communication thread; afterwards nothing writes into the buffers given to it. Idempotent;
  // the destructor calls it.
  void shutdown();

  TrafficStats& traffic() { return *traffic_; }
  double wait_seconds() const { return wait_seconds_; }

 private:
  Handle enqueue(const std::string& label, std::function<void()> body);
  void loop();
  void send_msg(const std::string& op, int peer, std::string msg);
  std::string recv_msg(const std::string& op, int peer);
  // Ring collectives among `members` (ascending ranks, this one included); empty: everyone.
  void ring_all_reduce(float* data, int64_t n, ReduceOp op, const std::string& label,
                       const std::vector<int>& members = {});
  void ring_all_gather(std::string payload, std::vector<std::string>* out, const std::string& label,
                       const std::vector<int>& members = {});
  void ring_all_gather_floats(const float* data, const std::vector<int64_t>& counts, std::vector<float>* out,
                              const std::string& label, const std::vector<int>& members);

  std::shared_ptr<Transport> transport_;
  CommOptions options_;
  std::shared_ptr<TraceRecorder> trace_;
  int channel_;
  int rank_, size_;
  std::shared_ptr<TrafficStats> traffic_;
  int64_t op_bytes_sent_ = 0;  // by the operation running on the communication thread
  double wait_seconds_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::pair<std::shared_ptr<Handle::State>, std::function<void()>>> queue_;
  std::exception_ptr failed_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace loco
