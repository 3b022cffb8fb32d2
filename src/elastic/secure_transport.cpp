#include "elastic/secure_transport.h"

#include <algorithm>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "elastic/redis.h"

namespace loco {

namespace {

using steady = std::chrono::steady_clock;

double seconds_left(steady::time_point deadline) {
  return std::chrono::duration<double>(deadline - steady::now()).count();
}
steady::time_point after(double s) {
  return steady::now() + std::chrono::microseconds(int64_t(s * 1e6));
}

// A socket closed when it goes out of scope.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    reset();
    fd_ = std::exchange(o.fd_, -1);
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Waits (in slices, so that `stop` is seen) for `events` on fd until the deadline; false on
// timeout or stop.
bool wait_fd(int fd, short events, steady::time_point deadline, const std::atomic<bool>* stop = nullptr) {
  for (;;) {
    if (stop && stop->load()) return false;
    const double left = seconds_left(deadline);
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, int(std::min(left, 0.1) * 1000) + 1);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

// Reads exactly n bytes; false on end of stream, error, timeout or stop (`eof` tells the first).
bool read_full(int fd, void* buf, size_t n, steady::time_point deadline, const std::atomic<bool>* stop,
               bool* eof = nullptr) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= size_t(r);
      continue;
    }
    if (r == 0) {
      if (eof) *eof = true;
      return false;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
    if (!wait_fd(fd, POLLIN, deadline, stop)) return false;
  }
  return true;
}

// Writes exactly n bytes; false on error, timeout or stop.
bool write_full(int fd, const void* buf, size_t n, steady::time_point deadline, const std::atomic<bool>* stop) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL);
    if (r > 0) {
      p += r;
      n -= size_t(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    if (!wait_fd(fd, POLLOUT, deadline, stop)) return false;
  }
  return true;
}

std::string local_host_name() {
  char name[256] = {0};
  if (::gethostname(name, sizeof name - 1) != 0) fail("elastic: cannot read this host's name; set elastic.address");
  return name;
}

std::string peer_name(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "an unknown address";
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "an unknown address";
  return std::string(host) + ":" + port;
}

void tune(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  set_nonblocking(fd);
}

// One established, authenticated connection to a peer.
struct Peer {
  Fd fd;
  std::unique_ptr<FrameSealer> sealer;
  std::unique_ptr<FrameOpener> opener;
  std::deque<std::pair<int, std::string>> outgoing;  // (channel, message) not yet written
  bool writing = false;                              // the writer holds a message
  std::vector<std::deque<std::string>> inbox;        // per channel
  std::vector<std::string> partial;                  // per channel: a message's frames so far
  bool closed = false;                               // the peer ended its stream
  std::thread reader, writer;
};

class SecureTransport : public Transport {
 public:
  SecureTransport(AddressBook& book, const std::string& prefix, const Key& run_key, const std::string& id, int rank,
                  int size, const SecureTransportOptions& o)
      : rank_(rank),
        size_(size),
        timeout_s_(o.timeout_s),
        clock_(real_clock()),
        run_key_(run_key),
        kt_(derive_transport_key(run_key, id)),
        prefix_(prefix),
        peers_(size) {
    const auto deadline = after(o.timeout_s);
    Fd listener;
    if (rank < size - 1) listener = listen_and_publish(book, o.address);
    // Failures keep their type (PeerError names the peers to blame).
    std::exception_ptr accept_error, connect_error;
    std::thread acceptor;
    std::atomic<bool> accepted{false};
    if (listener.get() >= 0)
      acceptor = std::thread([&] {
        try {
          accept_peers(listener.get(), deadline);
        } catch (...) {
          accept_error = std::current_exception();
        }
        accepted = true;
      });
    try {
      for (int j = 0; j < rank; ++j) connect_to(book, j, deadline);
      // This thread alone uses the book: while the higher ranks connect, it keeps this member's
      // address entry as published.
      while (acceptor.joinable() && !accepted) {
        guard_address(book);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    } catch (...) {
      connect_error = std::current_exception();
      setup_stop_ = true;
    }
    if (acceptor.joinable()) acceptor.join();
    if (connect_error) std::rethrow_exception(connect_error);
    if (accept_error) std::rethrow_exception(accept_error);
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      auto& p = peers_[j];
      p.inbox.resize(kNumChannels);
      p.partial.resize(kNumChannels);
      p.reader = std::thread([this, j] { read_loop(j); });
      p.writer = std::thread([this, j] { write_loop(j); });
    }
  }

  ~SecureTransport() override {
    {
      // Messages handed to send are delivered unless the transport failed (bounded).
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_until(lock, after(timeout_s_), [&] {
        if (!failed_.empty()) return true;
        for (int j = 0; j < size_; ++j)
          if (j != rank_ && (!peers_[j].outgoing.empty() || peers_[j].writing)) return false;
        return true;
      });
      stop_ = true;
    }
    cv_.notify_all();
    for (int j = 0; j < size_; ++j) {
      if (j == rank_) continue;
      auto& p = peers_[j];
      if (p.fd.get() >= 0) ::shutdown(p.fd.get(), SHUT_RDWR);
      if (p.writer.joinable()) p.writer.join();
      if (p.reader.joinable()) p.reader.join();
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "elastic"; }
  const Clock& clock() const override { return *clock_; }

  SendTiming send(int peer, int channel, std::string message) override {
    check(peer >= 0 && peer < size_ && peer != rank_, "internal: elastic send to a bad peer");
    check(channel >= 0 && channel < kNumChannels, "internal: elastic send on a bad channel");
    const double t = clock_->now();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_.empty()) throw_failed();
      peers_[peer].outgoing.emplace_back(channel, std::move(message));
    }
    cv_.notify_all();
    return {t, t};
  }

  std::string recv(int peer, int channel, double timeout_seconds) override {
    check(peer >= 0 && peer < size_ && peer != rank_, "internal: elastic recv from a bad peer");
    check(channel >= 0 && channel < kNumChannels, "internal: elastic recv on a bad channel");
    const double limit = std::min(timeout_seconds, timeout_s_);
    std::unique_lock<std::mutex> lock(mu_);
    auto& p = peers_[peer];
    auto& q = p.inbox[channel];
    const bool ready = cv_.wait_until(lock, after(limit), [&] { return !q.empty() || !failed_.empty() || p.closed; });
    if (!q.empty()) {
      std::string m = std::move(q.front());
      q.pop_front();
      return m;
    }
    if (!failed_.empty()) throw_failed();
    if (ready && p.closed) throw PeerError("member " + std::to_string(peer) + " is gone (it closed the connection)", {peer});
    const std::string why =
        "member " + std::to_string(peer) + " did not answer within " + std::to_string(int(limit)) + " s (elastic.timeout)";
    lock.unlock();
    set_failed(why, {peer});
    throw PeerError(why, {peer});
  }

  void abort(const std::string& reason) override { set_failed(reason, {}); }

 private:
  // The first failure wins; `peers` are the ranks it is attributed to (none for an abort).
  void set_failed(const std::string& why, std::vector<int> peers) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_.empty()) {
        failed_ = why;
        failed_peers_ = std::move(peers);
      }
    }
    cv_.notify_all();
  }
  // With mu_ held.
  [[noreturn]] void throw_failed() const {
    if (failed_peers_.empty()) fail(failed_);
    throw PeerError(failed_, failed_peers_);
  }

  // A listening socket on an ephemeral port; HOST:PORT and its MAC go to Redis.
  Fd listen_and_publish(AddressBook& book, const std::string& address) {
    Fd s(::socket(AF_INET6, SOCK_STREAM, 0));
    bool v6 = s.get() >= 0;
    if (v6) {
      const int zero = 0;
      ::setsockopt(s.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      v6 = ::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    }
    if (!v6) {
      s = Fd(::socket(AF_INET, SOCK_STREAM, 0));
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      if (s.get() < 0 || ::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
        fail(std::string("elastic: cannot open a listening socket: ") + std::strerror(errno));
    }
    if (::listen(s.get(), SOMAXCONN) != 0) fail(std::string("elastic: cannot listen: ") + std::strerror(errno));
    set_nonblocking(s.get());
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&bound), &len);
    const int port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                                 : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    const std::string where = (address.empty() ? local_host_name() : address) + " " + std::to_string(port);
    own_key_ = prefix_ + "addr:" + std::to_string(rank_);
    own_entry_ = where + " " + mac_entry(run_key_, own_key_, where);
    book.put(own_key_, own_entry_);
    return s;
  }

  // Writes this member's address entry again if someone replaced or removed it (checked at most
  // every 100 ms): the peers ignore an entry without the run's MAC and wait for the real one.
  void guard_address(AddressBook& book) {
    if (own_key_.empty() || steady::now() < next_guard_) return;
    next_guard_ = steady::now() + std::chrono::milliseconds(100);
    std::string v;
    if (book.get(own_key_, &v) && v == own_entry_) return;
    if (!guard_warned_)
      std::fprintf(stderr, "loco: warning: elastic: this member's address entry in Redis was replaced or removed; "
                           "writing it again\n");
    guard_warned_ = true;
    book.put(own_key_, own_entry_);
  }

  void warn_dropped(const std::string& who, const std::string& why) {
    const int n = ++dropped_;
    if (n <= 3)
      std::fprintf(stderr, "loco: warning: elastic: dropped a connection from %s that %s\n", who.c_str(), why.c_str());
    else if (n == 4)
      std::fprintf(stderr, "loco: warning: elastic: dropping further unauthenticated connections silently\n");
  }

  // Accepts until every higher rank has completed the handshake, or fails at the deadline.
  // Connections are served together (non-blocking), each within the timeout from its accept,
  // so that an outsider's connection holds no member's place.
  void accept_peers(int listener, steady::time_point deadline) {
    struct Pending {
      Fd fd;
      std::string who, in;
      steady::time_point until;
      bool welcomed = false;
      uint32_t from = 0;
      Nonce nc{}, ns{};
    };
    std::vector<Pending> pending;
    int missing = size_ - 1 - rank_;
    while (missing > 0) {
      if (setup_stop_) return;
      if (seconds_left(deadline) <= 0) {
        std::string who;
        std::vector<int> missing_ranks;
        for (int j = rank_ + 1; j < size_; ++j)
          if (peers_[j].fd.get() < 0) {
            who += (who.empty() ? "" : ", ") + std::to_string(j);
            missing_ranks.push_back(j);
          }
        throw PeerError("elastic: member(s) " + who + " of the quorum did not connect and authenticate within " +
                            std::to_string(int(timeout_s_)) + " s",
                        missing_ranks);
      }
      std::vector<pollfd> fds{{listener, POLLIN, 0}};
      for (auto& p : pending) fds.push_back({p.fd.get(), POLLIN, 0});
      ::poll(fds.data(), fds.size(), 50);
      if (fds[0].revents & POLLIN)
        for (;;) {
          Fd c(::accept(listener, nullptr, nullptr));
          if (c.get() < 0) break;
          tune(c.get());
          Pending p;
          p.who = peer_name(c.get());
          p.fd = std::move(c);
          p.until = after(timeout_s_);
          if (pending.size() >= 64) {
            // Full: the oldest connection that has sent nothing yet makes room (a member sends its
            // HELLO as soon as it connects), so that held connections cannot starve the members.
            auto silent = std::find_if(pending.begin(), pending.end(),
                                       [](const Pending& q) { return !q.welcomed && q.in.empty(); });
            if (silent == pending.end()) {
              warn_dropped(p.who, "came while 64 others were still authenticating");
              continue;
            }
            warn_dropped(silent->who, "sent nothing while newer connections waited");
            pending.erase(silent);
          }
          pending.push_back(std::move(p));
        }
      for (size_t i = 0; i < pending.size();) {
        auto& p = pending[i];
        std::string why;
        const size_t want = p.welcomed ? kConfirmBytes : kHelloBytes;
        char buf[kHelloBytes];
        const ssize_t r = ::recv(p.fd.get(), buf, want - p.in.size(), 0);
        if (r > 0) p.in.append(buf, size_t(r));
        if (r == 0) why = "closed before authenticating";
        if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) why = "failed before authenticating";
        if (why.empty() && p.in.size() == want) {
          const auto* b = reinterpret_cast<const uint8_t*>(p.in.data());
          if (!p.welcomed) {
            if (!open_hello(kt_, b, uint32_t(rank_), &p.from, &p.nc) || int(p.from) >= size_) {
              why = "did not authenticate (a bad HELLO)";
            } else {
              p.ns = random_nonce();
              const std::string w = make_welcome(kt_, p.from, uint32_t(rank_), p.nc, p.ns);
              if (!write_full(p.fd.get(), w.data(), w.size(), p.until, nullptr)) why = "did not take the WELCOME";
              p.welcomed = true;
              p.in.clear();
            }
          } else if (!confirm_ok(kt_, b, p.from, uint32_t(rank_), p.nc, p.ns)) {
            why = "did not authenticate (a bad CONFIRM)";
          } else if (peers_[p.from].fd.get() >= 0) {
            why = "claimed member " + std::to_string(p.from) + "'s place twice";
          } else {
            auto& peer = peers_[p.from];
            peer.sealer = std::make_unique<FrameSealer>(direction_key(kt_, uint32_t(rank_), p.from, p.nc, p.ns));
            peer.opener = std::make_unique<FrameOpener>(direction_key(kt_, p.from, uint32_t(rank_), p.nc, p.ns),
                                                        uint32_t(kNumChannels));
            peer.fd = std::move(p.fd);
            --missing;
            pending.erase(pending.begin() + i);
            continue;
          }
        }
        if (why.empty() && steady::now() > p.until) why = "did not authenticate within " + std::to_string(int(timeout_s_)) + " s";
        if (!why.empty()) {
          warn_dropped(p.who, why);
          pending.erase(pending.begin() + i);
          continue;
        }
        ++i;
      }
    }
  }

  // Reads member j's address from Redis (its MAC checked), connects and authenticates.
  void connect_to(AddressBook& book, int j, steady::time_point deadline) {
    const std::string key = prefix_ + "addr:" + std::to_string(j);
    const std::string member = "member " + std::to_string(j);
    bool warned = false, genuine = false;
    for (;;) {
      guard_address(book);
      if (seconds_left(deadline) <= 0) {
        // Only forged entries seen: the member is not at fault (anyone who can write to Redis can
        // do that), so it is not blamed; the attempt fails and the next one tries again.
        if (warned && !genuine)
          throw PeerError("elastic: " + member + "'s address in Redis carried no MAC of this run for " +
                              std::to_string(int(timeout_s_)) + " s (forged, or this worker holds another secret); "
                              "nobody is blamed",
                          {});
        throw PeerError("elastic: " + member + " of the quorum could not be reached and authenticated within " +
                            std::to_string(int(timeout_s_)) + " s",
                        {j});
      }
      std::string v, host, port, mac;
      const bool found = book.get(key, &v);
      if (found) {
        const size_t a = v.find(' '), b = a == std::string::npos ? a : v.find(' ', a + 1);
        if (b != std::string::npos) {
          host = v.substr(0, a);
          port = v.substr(a + 1, b - a - 1);
          mac = v.substr(b + 1);
        }
        if (host.empty() || !entry_mac_ok(run_key_, key, host + " " + port, mac)) {
          if (!warned)
            std::fprintf(stderr,
                         "loco: warning: elastic: ignoring an address for %s without this run's MAC (forged, "
                         "malformed, or this worker holds another secret)\n",
                         member.c_str());
          warned = true;
          host.clear();
        }
        genuine |= !host.empty();
      }
      if (!host.empty() && try_connect(host, port, j, deadline)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  bool try_connect(const std::string& host, const std::string& port, int j, steady::time_point deadline) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || !res) return false;
    std::unique_ptr<addrinfo, void (*)(addrinfo*)> hold(res, ::freeaddrinfo);
    for (addrinfo* a = res; a; a = a->ai_next) {
      Fd s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
      if (s.get() < 0) continue;
      tune(s.get());
      if (::connect(s.get(), a->ai_addr, a->ai_addrlen) != 0) {
        if (errno != EINPROGRESS || !wait_fd(s.get(), POLLOUT, deadline, &setup_stop_)) continue;
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) continue;
      }
      const Nonce nc = random_nonce();
      const std::string hello = make_hello(kt_, uint32_t(rank_), uint32_t(j), nc);
      uint8_t welcome[kWelcomeBytes];
      Nonce ns;
      if (!write_full(s.get(), hello.data(), hello.size(), deadline, &setup_stop_) ||
          !read_full(s.get(), welcome, sizeof welcome, deadline, &setup_stop_))
        continue;
      if (!open_welcome(kt_, welcome, uint32_t(rank_), uint32_t(j), nc, &ns))
        throw PeerError("elastic: member " + std::to_string(j) + " at " + host + ":" + port +
                            " did not authenticate (another run's secret, or not a member)",
                        {j});
      const std::string confirm = make_confirm(kt_, uint32_t(rank_), uint32_t(j), nc, ns);
      if (!write_full(s.get(), confirm.data(), confirm.size(), deadline, &setup_stop_)) continue;
      auto& peer = peers_[j];
      peer.sealer = std::make_unique<FrameSealer>(direction_key(kt_, uint32_t(rank_), uint32_t(j), nc, ns));
      peer.opener = std::make_unique<FrameOpener>(direction_key(kt_, uint32_t(j), uint32_t(rank_), nc, ns),
                                                  uint32_t(kNumChannels));
      peer.fd = std::move(s);
      return true;
    }
    return false;
  }

  void write_loop(int j) {
    auto& p = peers_[j];
    std::string sealed;
    for (;;) {
      std::pair<int, std::string> msg;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !failed_.empty() || !p.outgoing.empty(); });
        if (stop_ || !failed_.empty()) return;
        msg = std::move(p.outgoing.front());
        p.outgoing.pop_front();
        p.writing = true;
      }
      const std::string& m = msg.second;
      size_t at = 0;
      bool ok = true;
      do {
        const size_t n = std::min(kMaxFrame, m.size() - at);
        sealed.clear();
        p.sealer->seal(uint32_t(msg.first), at + n == m.size(), m.data() + at, n, sealed);
        ok = write_full(p.fd.get(), sealed.data(), sealed.size(), after(timeout_s_), &stop_);
        at += n;
      } while (ok && at < m.size());
      {
        std::lock_guard<std::mutex> lock(mu_);
        p.writing = false;
        if (!ok && failed_.empty() && !stop_) {
          failed_ = "member " + std::to_string(j) + " did not take data within " + std::to_string(int(timeout_s_)) +
                    " s, or is gone (elastic.timeout)";
          failed_peers_ = {j};
        }
      }
      cv_.notify_all();
      if (!ok) return;
    }
  }

  void read_loop(int j) {
    auto& p = peers_[j];
    std::vector<uint8_t> body;
    std::string why;
    const auto forever = steady::time_point::max();
    try {
      for (;;) {
        uint8_t h[kFrameHeaderBytes];
        bool eof = false;
        if (!read_full(p.fd.get(), h, sizeof h, forever, &stop_, &eof)) {
          std::lock_guard<std::mutex> lock(mu_);
          p.closed = true;
          break;
        }
        const FrameHeader fh = p.opener->header(h);
        body.resize(fh.length + kFrameTagBytes);
        if (!read_full(p.fd.get(), body.data(), body.size(), forever, &stop_)) {
          if (!stop_) why = "member " + std::to_string(j) + " is gone (its stream ended inside a frame)";
          break;
        }
        std::string& msg = p.partial[fh.channel];  // only this thread touches partial
        if (msg.size() + fh.length > kMaxMessageBytes) fail("a message larger than the limit");
        const size_t at = msg.size();
        msg.resize(at + fh.length);
        p.opener->open(h, fh, body.data(), reinterpret_cast<uint8_t*>(msg.data() + at));
        if (fh.flags & kFrameLast) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            p.inbox[fh.channel].push_back(std::move(msg));
          }
          msg.clear();
          cv_.notify_all();
        }
      }
    } catch (const std::exception& e) {
      why = "member " + std::to_string(j) + " sent " + e.what();
    }
    if (!why.empty()) set_failed(why, {j});
    cv_.notify_all();
  }

  const int rank_, size_;
  const double timeout_s_;
  std::shared_ptr<Clock> clock_;
  const Key run_key_, kt_;
  const std::string prefix_;
  std::vector<Peer> peers_;
  std::atomic<bool> stop_{false}, setup_stop_{false};
  std::atomic<int> dropped_{0};
  std::string own_key_, own_entry_;  // this member's address entry, as published
  steady::time_point next_guard_{};
  bool guard_warned_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string failed_;
  std::vector<int> failed_peers_;
};

class RedisAddressBook : public AddressBook {
 public:
  explicit RedisAddressBook(Redis& redis) : redis_(redis) {}
  void put(const std::string& key, const std::string& value) override {
    redis_.command({"SET", key, value, "EX", "3600"});
  }
  bool get(const std::string& key, std::string* value) override {
    bool found = false;
    *value = redis_.get(key, &found);
    return found;
  }

 private:
  Redis& redis_;
};

}  // namespace

std::unique_ptr<AddressBook> redis_address_book(Redis& redis) { return std::make_unique<RedisAddressBook>(redis); }

void MemoryAddressBook::put(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_[key] = value;
}

bool MemoryAddressBook::get(const std::string& key, std::string* value) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  *value = it->second;
  return true;
}

std::unique_ptr<Transport> make_secure_transport(AddressBook& book, const std::string& key_prefix, const Key& run_key,
                                                 const std::string& transport_id, int rank, int size,
                                                 const SecureTransportOptions& options) {
  return std::make_unique<SecureTransport>(book, key_prefix, run_key, transport_id, rank, size, options);
}

}  // namespace loco
