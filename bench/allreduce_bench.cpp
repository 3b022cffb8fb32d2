// How well loco's MPI transport keeps a slow link busy (bench/network.sh, in the lab of
// scripts/netlab.sh). On every rank, REPEATS rounds, each timing one of both:
//   - raw: plain TCP sockets (no MPI, no loco) in a ring, every rank streaming the bytes one
//     all-reduce sends, 2 (M-1)/M x 4 FLOATS, to the next rank while receiving as many from the
//     previous one: the rate the network and this machine allow for that traffic;
//   - ring: loco's ring all-reduce of FLOATS floats through the MPI transport.
// The two alternate, so that both see the same conditions: a shaped link's rate varies over a
// run (TCP's window against the queue it builds, CPU shared with the lab's delay helpers), and
// timing all raw rounds before all ring rounds turned that drift into the ratio.
// Prints per rank both rates (bytes sent per second over all rounds), ring / raw, and the CPU
// time this process spent per MB sent in each (all its threads; the kernel's share of the
// socket calls made from them included): on a machine with few cores, the lab's helpers and the
// ranks compete for CPU, and a transport that needs more of it leaves the link idle.
//
//   mpirun -np M loco_allreduce_bench [FLOATS] [REPEATS]
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi_transport.h"
#include "core/error.h"

using namespace loco;

namespace {

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// This host's first non-loopback IPv4 address (a lab namespace has one).
std::string own_address() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) fail("getifaddrs failed");
  std::string found = "127.0.0.1";
  for (ifaddrs* a = list; a; a = a->ifa_next)
    if (a->ifa_addr && a->ifa_addr->sa_family == AF_INET) {
      char b[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, b, sizeof b);
      if (std::string(b) != "127.0.0.1") {
        found = b;
        break;
      }
    }
  freeifaddrs(list);
  return found;
}

void send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, 0);
    if (k <= 0) fail(std::string("raw send: ") + std::strerror(errno));
    p += k, n -= size_t(k);
  }
}

void recv_all(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k <= 0) fail(std::string("raw recv: ") + (k == 0 ? "closed" : std::strerror(errno)));
    p += k, n -= size_t(k);
  }
}

// Every wait on a peer is bounded (a dead peer ends the bench with an error, not a hang).
void set_timeouts(int fd) {
  timeval t{120, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof t);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &t, sizeof t);
}

// A TCP connection to the next rank and one from the previous rank.
struct RawRing {
  int to_next = -1, from_prev = -1;
  RawRing(Communicator& comm, int rank, int size) {
    const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    set_timeouts(listener);  // accept() waits at most this long
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof a;
    if (::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listener, 4) != 0 ||
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      fail(std::string("raw listen: ") + std::strerror(errno));
    std::vector<std::string> peers;
    peers = comm.all_gather(own_address() + " " + std::to_string(ntohs(a.sin_port)), "raw");
    const std::string& next = peers[size_t((rank + 1) % size)];
    sockaddr_in b{};
    b.sin_family = AF_INET;
    b.sin_port = htons(uint16_t(std::atoi(next.substr(next.find(' ') + 1).c_str())));
    inet_pton(AF_INET, next.substr(0, next.find(' ')).c_str(), &b.sin_addr);
    std::thread accepter([&] { from_prev = ::accept(listener, nullptr, nullptr); });
    to_next = ::socket(AF_INET, SOCK_STREAM, 0);
    set_timeouts(to_next);
    const bool connected = ::connect(to_next, reinterpret_cast<sockaddr*>(&b), sizeof b) == 0;
    accepter.join();
    ::close(listener);
    if (!connected || from_prev < 0) fail(std::string("raw connect: ") + std::strerror(errno));
    set_timeouts(from_prev);
  }
  ~RawRing() {
    ::close(to_next);
    ::close(from_prev);
  }
  // Streams n bytes to the next rank while receiving n from the previous one.
  // The sending thread reads `out`: it is joined on every path before this returns, and a
  // failure on either side stops the other (a socket shut down) and is reported, not fatal.
  void exchange(const std::string& out, std::string& in) {
    std::exception_ptr send_error, recv_error;
    std::thread sender([&] {
      try {
        send_all(to_next, out.data(), out.size());
      } catch (...) {
        send_error = std::current_exception();
        ::shutdown(from_prev, SHUT_RDWR);  // the receive below returns at once
      }
    });
    try {
      recv_all(from_prev, in.data(), in.size());
    } catch (...) {
      recv_error = std::current_exception();
      ::shutdown(to_next, SHUT_RDWR);  // the send above returns at once
    }
    sender.join();
    if (send_error) std::rethrow_exception(send_error);
    if (recv_error) std::rethrow_exception(recv_error);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int64_t floats = argc > 1 ? std::atoll(argv[1]) : int64_t(4) << 20;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 3;
  if (floats < 1 || repeats < 1) {
    std::fprintf(stderr, "usage: loco_allreduce_bench [FLOATS >= 1] [REPEATS >= 1]\n");
    return 2;
  }
  double raw = 0, ring = 0, raw_cpu = 0, ring_cpu = 0, mb = 0;
  int rank = 0, size = 1;
  try {
    std::shared_ptr<Transport> transport = make_mpi_transport();
    rank = transport->rank();
    size = transport->size();
    Communicator comm(transport, CommOptions{600, 1}, nullptr, kDataChannel);
    const Clock& clock = transport->clock();
    const int64_t ring_bytes = 2 * (size - 1) * floats * 4 / size;
    RawRing raw_ring(comm, rank, size);
    std::string out(size_t(ring_bytes), 'x'), in(size_t(ring_bytes), '\0');
    std::vector<float> data(size_t(floats), 1.0f);
    // Both past slow start and with their connections made, as in training.
    raw_ring.exchange(out, in);
    comm.all_reduce(data.data(), floats, ReduceOp::Sum, "gradients");
    double raw_s = 0, ring_s = 0;
    for (int i = 0; i < repeats; ++i) {
      comm.barrier();
      double t0 = clock.now(), c0 = process_cpu_seconds();
      raw_ring.exchange(out, in);
      raw_s += clock.now() - t0;
      raw_cpu += process_cpu_seconds() - c0;
      comm.barrier();
      t0 = clock.now(), c0 = process_cpu_seconds();
      comm.all_reduce(data.data(), floats, ReduceOp::Sum, "gradients");
      ring_s += clock.now() - t0;
      ring_cpu += process_cpu_seconds() - c0;
    }
    comm.barrier();
    raw = double(ring_bytes) * repeats / raw_s;
    ring = double(ring_bytes) * repeats / ring_s;
    mb = double(ring_bytes) * repeats / 1e6;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
    return 1;
  }
  std::printf("rank %d of %d: raw %.3g B/s, ring all-reduce %.3g B/s, ratio %.3f, CPU ms per MB raw %.2f ring %.2f\n",
              rank, size, raw, ring, ring / raw, 1e3 * raw_cpu / mb, 1e3 * ring_cpu / mb);
  finalize_mpi();
  return 0;
}
