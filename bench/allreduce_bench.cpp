// How well loco's MPI transport keeps a slow link busy (bench/network.sh, in the lab of
// scripts/netlab.sh): on every rank, first the raw rate of one large point-to-point transfer
// to the next rank (all ranks at once, as a ring step does), then loco's ring all-reduce of
// FLOATS floats, REPEATS times. Prints, per rank, the ring's rate (bytes a rank sends per
// all-reduce, 2 (M-1)/M x 4 FLOATS, over its wall time) and its ratio to the raw rate.
//
//   mpirun -np M loco_allreduce_bench [FLOATS] [REPEATS]
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi_transport.h"

using namespace loco;

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
    const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    // Raw: every rank sends the bytes of one all-reduce to its neighbour at once.
    const int64_t ring_bytes = 2 * (size - 1) * floats * 4 / size;
    comm.barrier();
    double t0 = clock.now();
    std::string got;
    for (int i = 0; i < repeats; ++i) {
      // (One communication thread runs the operations in order: the send, which only hands the
      // bytes to the transport, goes first.)
      auto s = comm.send_start(next, std::string(size_t(ring_bytes), 'x'), "raw");
      auto r = comm.recv_start(prev, &got, "raw");
      comm.wait(s);
      comm.wait(r);
    }
    raw = double(ring_bytes) * repeats / (clock.now() - t0);
    std::vector<float> data(size_t(floats), 1.0f);
    comm.barrier();
    t0 = clock.now();
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
