#include "comm/link.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "core/error.h"

namespace loco {

namespace {

class LinkTransport : public Transport {
 public:
  LinkTransport(std::unique_ptr<Transport> inner, LinkConfig link, std::shared_ptr<Clock> clock)
      : inner_(std::move(inner)), link_(link), clock_(std::move(clock)), conns_(size_t(inner_->size())) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }

  SendTiming send(int peer, int channel, std::string message) override {
    const double now = clock_->now();
    const double bytes = double(message.size());
    double start, end;
    {
      // One outgoing link per worker, shared by every channel and thread: its bytes go out first
      // come, first served. With TCP, a connection also sends its own messages in order, and a
      // slow-start round trip holds only that connection: connections to other peers use the
      // link meanwhile, as TCP's do (a worker sending to three peers at once pays one slow start,
      // not three in a row).
      std::lock_guard<std::mutex> lock(mu_);
      if (!link_.tcp) {
        start = std::max(now, link_free_);
        end = link_free_ = start + link_wire_time(link_, bytes);
      } else {
        TcpConnection& conn = conns_[size_t(peer)];
        start = std::max(now, conn.last_end);
        link_free_ = std::max(start, link_free_) + link_wire_time(link_, bytes);
        end = conn.last_end = std::max(start + link_transfer_time(link_, conn, start, bytes), link_free_);
      }
    }
    const double arrival = end + link_.latency_s;
    std::string framed(sizeof(double), '\0');
    std::memcpy(framed.data(), &arrival, sizeof(double));
    framed += message;
    inner_->send(peer, channel, std::move(framed));
    return {start, end};
  }

  std::string recv(int peer, int channel, double timeout) override {
    std::string framed = inner_->recv(peer, channel, timeout);
    if (framed.size() < sizeof(double)) fail("link model: malformed message from worker " + std::to_string(peer));
    double arrival;
    std::memcpy(&arrival, framed.data(), sizeof(double));
    // Arrival times are the sender's clock plus the link's delay: never unbounded.
    if (!std::isfinite(arrival) || arrival > clock_->now() + 1e6)
      fail("link model: malformed arrival time from worker " + std::to_string(peer));
    clock_->sleep_until(arrival);
    return framed.substr(sizeof(double));
  }

  void abort(const std::string& reason) override { inner_->abort(reason); }
  std::string name() const override { return inner_->name() + "+link"; }
  const Clock& clock() const override { return *clock_; }

 private:
  std::unique_ptr<Transport> inner_;
  LinkConfig link_;
  std::shared_ptr<Clock> clock_;
  std::mutex mu_;
  double link_free_ = 0;
  std::vector<TcpConnection> conns_;  // by peer
};

// Splits "12.5 Mbit/s" into 12.5 and "mbit/s" (lower case, spaces removed).
std::pair<double, std::string> number_and_unit(const std::string& text, const std::string& key) {
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s.push_back(char(std::tolower(static_cast<unsigned char>(c))));
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    fail(key + ": expected a number with a unit, got \"" + text + "\"");
  }
  if (!(v >= 0)) fail(key + ": must be >= 0, got \"" + text + "\"");
  return {v, s.substr(used)};
}

constexpr double kMss = 1448, kFrame = 1514;  // TCP payload and Ethernet frame of a full segment
// Payload bytes per second the link carries (TCP/IP and Ethernet headers taken off with TCP).
double payload_rate(const LinkConfig& link) { return link.bandwidth_bps / 8.0 * (link.tcp ? kMss / kFrame : 1.0); }

}  // namespace

double link_wire_time(const LinkConfig& link, double bytes) {
  return link.bandwidth_bps > 0 ? bytes / payload_rate(link) : 0.0;
}

double link_transfer_time(const LinkConfig& link, TcpConnection& conn, double start, double bytes) {
  if (link.bandwidth_bps <= 0) return 0.0;
  if (!link.tcp) return link_wire_time(link, bytes);
  constexpr double kInitialWindow = 10 * kMss, kMinRto = 0.2;
  const double rate = payload_rate(link);
  const double rtt = 2.0 * link.latency_s;
  double window = conn.window > 0 ? conn.window : kInitialWindow;
  if (conn.last_end >= 0 && rtt > 0) {  // restart after idle
    const double rto = rtt + kMinRto;
    for (double idle = start - conn.last_end - rto; idle > 0 && window > kInitialWindow; idle -= rto) window /= 2;
    window = std::max(window, kInitialWindow);
  }
  const double pipe = rate * rtt;  // bandwidth-delay product
  double left = bytes, t = 0;
  while (left > 0 && window < pipe) {  // slow start: a round of `window` bytes per round trip
    if (left <= window) {
      t += left / rate;
      left = 0;
      break;
    }
    t += rtt;
    left -= window;
    window *= 2;
  }
  t += left / rate;
  conn.window = window;
  conn.last_end = start + t;
  return t;
}

std::unique_ptr<Transport> wrap_with_link(std::unique_ptr<Transport> inner, LinkConfig link,
                                          std::shared_ptr<Clock> clock) {
  return std::make_unique<LinkTransport>(std::move(inner), link, std::move(clock));
}

double parse_bandwidth(const std::string& text, const std::string& key) {
  std::string lower;
  for (char c : text) lower.push_back(char(std::tolower(static_cast<unsigned char>(c))));
  if (lower.empty() || lower == "inf" || lower == "unlimited") return 0;
  auto [v, unit] = number_and_unit(text, key);
  if (unit.size() > 2 && unit.substr(unit.size() - 2) == "/s") unit.resize(unit.size() - 2);
  if (unit == "bps") unit = "bit";
  const std::pair<const char*, double> units[] = {{"bit", 1},     {"kbit", 1e3}, {"mbit", 1e6},
                                                  {"gbit", 1e9},  {"tbit", 1e12}, {"kbps", 1e3},
                                                  {"mbps", 1e6},  {"gbps", 1e9}};
  for (const auto& [name, scale] : units)
    if (unit == name) {
      if (v <= 0) fail(key + ": bandwidth must be > 0 (use \"inf\" for unlimited), got \"" + text + "\"");
      if (!(v * scale >= 1e3 && v * scale <= 1e18))
        fail(key + ": bandwidth must be between 1kbit and 1000000Tbit (or \"inf\"), got \"" + text + "\"");
      return v * scale;
    }
  fail(key + ": unknown bandwidth unit in \"" + text + "\" (use bit, kbit, Mbit, Gbit, Tbit per second, or inf)");
}

double parse_duration(const std::string& text, const std::string& key) {
  if (text.empty()) return 0;
  auto [v, unit] = number_and_unit(text, key);
  if (unit.empty() && v == 0) return 0;
  const std::pair<const char*, double> units[] = {{"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"min", 60}};
  for (const auto& [name, scale] : units)
    if (unit == name) return v * scale;
  fail(key + ": unknown time unit in \"" + text + "\" (use s, ms, us or min)");
}

double parse_timeout(const std::string& text, const std::string& key) {
  const double s = parse_duration(text, key);
  if (!(s > 0 && s <= kMaxTimeoutSeconds))
    fail(key + ": must be more than 0 and at most a week (10080min), got \"" + text + "\"");
  return s;
}

double parse_latency(const std::string& text, const std::string& key) {
  const double s = parse_duration(text, key);
  if (!(s <= kMaxLatencySeconds)) fail(key + ": must be at most an hour (60min), got \"" + text + "\"");
  return s;
}

}  // namespace loco
