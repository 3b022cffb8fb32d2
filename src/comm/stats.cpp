#include "comm/stats.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/error.h"
#include "core/json.h"

namespace loco {

bool is_sync_traffic(const std::string& op) {
  for (const char* t : {"gradients", "outer_gradients", "outer_progress", "outer_weights"})
    if (op == t) return true;
  return false;
}

bool is_training_traffic(const std::string& op) {
  if (is_sync_traffic(op)) return true;
  for (const char* t : {"activations", "tokens", "activation_grads", "tied_embedding", "grad_norm", "grassmann_A",
                        "grassmann_U", "outer_gradients_norms"})
    if (op == t) return true;
  return false;
}

void TrafficStats::record_send(const std::string& op, int64_t bytes, double start, double end) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& o = ops_[op];
  o.sent += bytes;
  ++o.messages_sent;
  if (bytes == 0) return;
  // Spread the bytes uniformly over [start, end] across the windows it touches.
  const int64_t first = int64_t(std::floor(start / window_)), last = int64_t(std::floor(end / window_));
  if (first == last || end <= start) {
    bins_[first] += double(bytes);
    return;
  }
  const double rate = double(bytes) / (end - start);
  for (int64_t b = first; b <= last; ++b) {
    const double lo = std::max(start, double(b) * window_), hi = std::min(end, double(b + 1) * window_);
    if (hi > lo) bins_[b] += rate * (hi - lo);
  }
}

void TrafficStats::record_recv(const std::string& op, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& o = ops_[op];
  o.received += bytes;
  ++o.messages_received;
}

void TrafficStats::record_instance(const std::string& op, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& o = ops_[op];
  o.largest_instance = std::max(o.largest_instance, bytes);
  ++o.instances;
}

int64_t TrafficStats::bytes_sent() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t s = 0;
  for (const auto& [k, o] : ops_) s += o.sent;
  return s;
}

int64_t TrafficStats::bytes_received() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t s = 0;
  for (const auto& [k, o] : ops_) s += o.received;
  return s;
}

int64_t TrafficStats::messages_sent() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t s = 0;
  for (const auto& [k, o] : ops_) s += o.messages_sent;
  return s;
}

int64_t TrafficStats::messages_received() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t s = 0;
  for (const auto& [k, o] : ops_) s += o.messages_received;
  return s;
}

double TrafficStats::peak_send_rate() const {
  std::lock_guard<std::mutex> lock(mu_);
  double peak = 0;
  for (const auto& [b, bytes] : bins_) peak = std::max(peak, bytes);
  return peak / window_;
}

nlohmann::json TrafficStats::to_json() const {
  nlohmann::json j;
  j["bytes_sent"] = bytes_sent();
  j["bytes_received"] = bytes_received();
  j["messages_sent"] = messages_sent();
  j["messages_received"] = messages_received();
  j["peak_send_bytes_per_s"] = peak_send_rate();
  j["peak_window_s"] = window_;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [k, o] : ops_)
    j["by_operation"][k] = {{"bytes_sent", o.sent},
                            {"bytes_received", o.received},
                            {"messages_sent", o.messages_sent},
                            {"messages_received", o.messages_received},
                            {"instances", o.instances},
                            {"largest_instance_bytes_sent", o.largest_instance}};
  return j;
}

void TrafficStats::restore(const nlohmann::json& saved, const std::string& source) {
  std::lock_guard<std::mutex> lock(mu_);
  try {
    for (const auto& item : saved.at("by_operation").items()) {
      auto& o = ops_[item.key()];
      const auto& v = item.value();
      auto get = [&](const char* key) {
        const int64_t x = json_integer(v, key, source);
        if (x < 0) throw std::invalid_argument(key);
        return x;
      };
      o.sent += get("bytes_sent");
      o.received += get("bytes_received");
      o.messages_sent += get("messages_sent");
      o.messages_received += get("messages_received");
      o.instances += get("instances");
      o.largest_instance = std::max(o.largest_instance, get("largest_instance_bytes_sent"));
    }
  } catch (const std::exception&) {
    throw Error(source + ": malformed traffic counters");
  }
}

void TraceRecorder::span(const std::string& name, const std::string& category, int tid, double start_s,
                         double end_s) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({{"name", name},
                     {"cat", category},
                     {"ph", "X"},
                     {"pid", pid_},
                     {"tid", tid},
                     {"ts", start_s * 1e6},
                     {"dur", std::max(0.0, end_s - start_s) * 1e6}});
}

nlohmann::json TraceRecorder::events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

}  // namespace loco
