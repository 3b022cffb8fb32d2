#pragma once
// Per-worker accounting: payload bytes and messages sent/received (by operation), peak send
// rate over a window, and a Chrome trace-event timeline of compute and communication spans.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace loco {

// Operations that belong to the training method itself (not evaluation, checkpoints, reports,
// diagnostics), and among them the synchronizations of the data-parallel methods (whose
// largest instance is the "largest sync").
bool is_training_traffic(const std::string& op);
bool is_sync_traffic(const std::string& op);

class TrafficStats {
 public:
  explicit TrafficStats(double peak_window_s = 1.0) : window_(peak_window_s) {}
  // A sent message whose bytes were on the sender's link during [start, end].
  void record_send(const std::string& op, int64_t bytes, double start, double end);
  void record_recv(const std::string& op, int64_t bytes);
  // Bytes one instance of an operation (one collective) sent; keeps the largest per operation.
  void record_instance(const std::string& op, int64_t bytes);
  int64_t bytes_sent() const;
  int64_t bytes_received() const;
  int64_t messages_sent() const;
  int64_t messages_received() const;
  // Highest average send rate (bytes/s) over any window-aligned interval of the run.
  double peak_send_rate() const;
  double window() const { return window_; }
  nlohmann::json to_json() const;
  // The per-operation counters of an earlier segment of the run (its to_json()), which later
  // traffic adds to; the peak rate covers this segment only. Fails on a malformed record.
  void restore(const nlohmann::json& saved, const std::string& source);

 private:
  mutable std::mutex mu_;
  double window_;
  struct PerOp {
    int64_t sent = 0, received = 0, messages_sent = 0, messages_received = 0, largest_instance = 0, instances = 0;
  };
  std::map<std::string, PerOp> ops_;
  std::map<int64_t, double> bins_;  // window index -> bytes on the wire in it
};

// Chrome trace-event JSON (viewable in Perfetto / chrome://tracing): complete events ("X").
class TraceRecorder {
 public:
  // One recorder per worker; `pid` is the worker's rank among all workers.
  explicit TraceRecorder(bool enabled, int pid = 0) : enabled_(enabled), pid_(pid) {}
  bool enabled() const { return enabled_; }
  // tid: 0 the worker's own thread (compute, pipeline passes, waits), 1 + channel the
  // communication thread of that channel (transport.h).
  void span(const std::string& name, const std::string& category, int tid, double start_s, double end_s);
  nlohmann::json events() const;

 private:
  bool enabled_;
  int pid_;
  mutable std::mutex mu_;
  nlohmann::json events_ = nlohmann::json::array();
};

}  // namespace loco
