// How well loco's MPI transport keeps a slow link busy (bench/network.sh, in the lab of
// scripts/netlab.sh). On every rank, REPEATS times each:
//   - raw: plain TCP sockets (no MPI, no loco) in a ring, every rank streaming the bytes one
//     all-reduce sends, 2 (M-1)/M x 4 FLOATS, to the next rank while receiving as many from the
//     previous one: the rate the network and this machine allow for that traffic;
//   - ring: loco's ring all-reduce of FLOATS floats through the MPI transport.
// Prints per rank both rates (bytes sent per second) and ring / raw.
//
//   mpirun -np M loco_allreduce_bench [FLOATS] [REPEATS]
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi_transport.h"
#include "core/error.h"

using namespace loco;

namespace {

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
  void exchange(const std::string& out, std::string& in) {
    std::thread sender([&] { send_all(to_next, out.data(), out.size()); });
    recv_all(from_prev, in.data(), in.size());
    sender.join();
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int64_t floats = argc > 1 ? std::atoll(argv[1]) : int64_t(4) << 20;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 3;
  double raw = 0, ring = 0;
  int rank = 0, size = 1;
  try {
    std::shared_ptr<Transport> transport = make_mpi_transport();
    rank = transport->rank();
    size = transport->size();
    Communicator comm(transport, CommOptions{600, 1}, nullptr, kDataChannel);
    const Clock& clock = transport->clock();
    const int64_t ring_bytes = 2 * (size - 1) * floats * 4 / size;
    {
      RawRing raw_ring(comm, rank, size);
      std::string out(size_t(ring_bytes), 'x'), in(size_t(ring_bytes), '\0');
      raw_ring.exchange(out, in);  // past slow start, as the ring's connections are below
      comm.barrier();
      const double t0 = clock.now();
      for (int i = 0; i < repeats; ++i) raw_ring.exchange(out, in);
      raw = double(ring_bytes) * repeats / (clock.now() - t0);
    }
    std::vector<float> data(size_t(floats), 1.0f);
    comm.all_reduce(data.data(), floats, ReduceOp::Sum, "gradients");  // connections made, as in training
    comm.barrier();
    const double t0 = clock.now();
    for (int i = 0; i < repeats; ++i) comm.all_reduce(data.data(), floats, ReduceOp::Sum, "gradients");
    ring = double(ring_bytes) * repeats / (clock.now() - t0);
    comm.barrier();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
    return 1;
  }
  std::printf("rank %d of %d: raw %.3g B/s, ring all-reduce %.3g B/s, ratio %.3f\n", rank, size, raw, ring, ring / raw);
  finalize_mpi();
  return 0;
}
