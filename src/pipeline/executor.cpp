#include "pipeline/executor.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"

namespace loco {

namespace {

template <class T>
std::string to_bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <class T>
void from_bytes(const std::string& bytes, std::vector<T>& out) {
  out.resize(bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
}

}  // namespace

Route fixed_route(const Grid& grid, int rank) {
  const int s = grid.stage_of(rank), r = grid.replica_of(rank);
  return {[=](int) { return grid.rank(s - 1, r); }, [=](int) { return grid.rank(s + 1, r); }};
}

std::vector<int> route_permutation(int R, uint64_t seed, int64_t step, int mb, int boundary) {
  constexpr uint64_t kRouteTag = 0x6e6f6c6f636f5231ULL;
  return seeded_permutation(R, mix_seed(seed ^ kRouteTag, uint64_t(step), (uint64_t(mb) << 20) ^ uint64_t(boundary)));
}

Route random_route(const Grid& grid, int rank, uint64_t seed, const int64_t* step) {
  const int s = grid.stage_of(rank), r = grid.replica_of(rank), R = grid.replicas;
  auto next = [=](int mb) {
    return grid.rank(s + 1, route_permutation(R, seed, *step, mb, s)[size_t(r)]);
  };
  auto prev = [=](int mb) {
    const auto perm = route_permutation(R, seed, *step, mb, s - 1);
    const auto from = std::find(perm.begin(), perm.end(), r);
    check(from != perm.end(), "random route: not a permutation");
    return grid.rank(s - 1, int(from - perm.begin()));
  };
  return {prev, next};
}

PipelineExecutor::PipelineExecutor(std::shared_ptr<Transport> transport, Grid grid, int rank, double timeout_s,
                                   std::shared_ptr<TrafficStats> traffic, std::shared_ptr<TraceRecorder> trace)
    : transport_(std::move(transport)),
      grid_(grid),
      rank_(rank),
      stage_(grid.stage_of(rank)),
      timeout_s_(timeout_s),
      traffic_(std::move(traffic)),
      trace_(trace ? std::move(trace) : std::make_shared<TraceRecorder>(false)) {}

std::string PipelineExecutor::recv_from(int peer, const char* what, int mb) {
  const Clock& clock = transport_->clock();
  const double t0 = clock.now();
  std::string msg;
  try {
    msg = transport_->recv(peer, kPipelineChannel, timeout_s_);
  } catch (const Error& e) {
    fail(grid_.describe(rank_) + ": no " + what + " of microbatch " + std::to_string(mb) + " from " +
         grid_.describe(peer) + ": " + e.what());
  }
  const double t1 = clock.now();
  if (std::strcmp(what, "eval") != 0) {  // evaluation time is accounted as a whole elsewhere
    bubble_s_ += t1 - t0;
    if (t1 > t0) trace_->span(std::string("wait ") + what, "bubble", 0, t0, t1);
  }
  traffic_->record_recv(what, int64_t(msg.size()));
  return msg;
}

void PipelineExecutor::send_forward(int peer, const BoundaryMessage& msg, bool evaluation) {
  for (auto [label, bytes] :
       {std::pair<const char*, std::string>{evaluation ? "eval" : "activations", to_bytes(msg.activations)},
        std::pair<const char*, std::string>{evaluation ? "eval" : "tokens", to_bytes(msg.tokens)}}) {
    const int64_t n = int64_t(bytes.size());
    const SendTiming t = transport_->send(peer, kPipelineChannel, std::move(bytes));
    traffic_->record_send(label, n, t.start, t.end);
  }
}

void PipelineExecutor::recv_forward(int peer, BoundaryMessage& msg, int mb, bool evaluation) {
  from_bytes(recv_from(peer, evaluation ? "eval" : "activations", mb), msg.activations);
  from_bytes(recv_from(peer, evaluation ? "eval" : "tokens", mb), msg.tokens);
}

void PipelineExecutor::run(const std::vector<PipeOp>& ops, StageCompute& compute, const Route& route) {
  const Clock& clock = transport_->clock();
  const bool first = stage_ == 0, last = stage_ == grid_.stages - 1;
  for (const auto& op : ops) {
    const int mb = op.microbatch;
    if (op.kind == PipeOp::Forward) {
      if (!first) recv_forward(route.prev(mb), in_, mb);
      const double t0 = clock.now();
      compute.forward(mb, in_, out_);
      const double t1 = clock.now();
      compute_s_ += t1 - t0;
      trace_->span("F" + std::to_string(mb), "pipeline", 0, t0, t1);
      if (!last) send_forward(route.next(mb), out_);
    } else {
      if (!last) from_bytes(recv_from(route.next(mb), "activation_grads", mb), grad_out_);
      else grad_out_.clear();
      const double t0 = clock.now();
      compute.backward(mb, grad_out_, grad_in_);
      const double t1 = clock.now();
      compute_s_ += t1 - t0;
      backward_s_ += t1 - t0;
      trace_->span("B" + std::to_string(mb), "pipeline", 0, t0, t1);
      if (!first) {
        std::string bytes = to_bytes(grad_in_);
        const int64_t n = int64_t(bytes.size());
        const SendTiming t = transport_->send(route.prev(mb), kPipelineChannel, std::move(bytes));
        traffic_->record_send("activation_grads", n, t.start, t.end);
      }
    }
  }
  ++steps_;
}

}  // namespace loco
