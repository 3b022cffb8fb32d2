// What the elastic data plane's authenticated encryption (elastic/secure_transport.h) costs.
//   1. ChaCha20-Poly1305 on one core: sealing and opening 64 KiB frames, GB/s (best of 5).
//   2. A round: loco's ring all-reduce of FLOATS floats among M members (threads of this
//      process) under the link model at BANDWIDTH, over the in-process transport (nothing
//      copied, nothing encrypted) and over the secure transport on loopback TCP (framing,
//      encryption, the kernel's copies), alternating, REPEATS rounds each after one warm-up;
//      prints the median round time of each and their ratio. The M members share this
//      machine's cores, where on real hosts each has its own, so the ratio bounds the cost from
//      above.
//
//   loco_secure_bench [FLOATS] [M] [BANDWIDTH] [REPEATS]     (defaults 4200000 3 1Gbit 7)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <future>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/inprocess.h"
#include "comm/link.h"
#include "elastic/secure_transport.h"

using namespace loco;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void crypto_rates() {
  const Key key = derive_transport_key(derive_run_key("benchmark secret, 32 bytes long.", "bench"), "1:0");
  const std::string frame(kMaxFrame, 'x');
  const int frames = 1024;
  double seal_best = 1e30, open_best = 1e30;
  std::string stream;
  for (int rep = 0; rep < 5; ++rep) {
    FrameSealer sealer(key);
    stream.clear();
    stream.reserve(size_t(frames) * (kMaxFrame + 64));
    double t = now();
    for (int f = 0; f < frames; ++f) sealer.seal(1, true, frame.data(), frame.size(), stream);
    seal_best = std::min(seal_best, now() - t);
    FrameOpener opener(key, kNumChannels);
    std::string out(kMaxFrame, '\0');
    t = now();
    size_t at = 0;
    for (int f = 0; f < frames; ++f) {
      const auto* h = reinterpret_cast<const uint8_t*>(stream.data() + at);
      const FrameHeader fh = opener.header(h);
      opener.open(h, fh, h + kFrameHeaderBytes, reinterpret_cast<uint8_t*>(out.data()));
      at += kFrameHeaderBytes + fh.length + kFrameTagBytes;
    }
    open_best = std::min(open_best, now() - t);
  }
  const double bytes = double(frames) * kMaxFrame;
  std::printf("ChaCha20-Poly1305, 64 KiB frames, one core: seal %.2f GB/s, open %.2f GB/s\n", bytes / seal_best / 1e9,
              bytes / open_best / 1e9);
}

// One ring all-reduce on every member at once; returns the slowest member's time.
double round_time(std::vector<std::shared_ptr<Transport>>& ts, int64_t floats) {
  const int M = int(ts.size());
  std::vector<std::future<double>> fs;
  for (int r = 0; r < M; ++r)
    fs.push_back(std::async(std::launch::async, [&, r] {
      Communicator comm(ts[size_t(r)], {60, 1}, nullptr, kDataChannel);
      std::vector<float> data(size_t(floats), float(r + 1));
      const double t = now();
      comm.all_reduce(data.data(), floats, ReduceOp::Sum);
      return now() - t;
    }));
  double worst = 0;
  for (auto& f : fs) worst = std::max(worst, f.get());
  return worst;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int64_t floats = argc > 1 ? std::atoll(argv[1]) : 4200000;
    const int M = argc > 2 ? std::atoi(argv[2]) : 3;
    const std::string bw = argc > 3 ? argv[3] : "1Gbit";
    const int repeats = argc > 4 ? std::atoi(argv[4]) : 7;
    if (floats < 1 || M < 2 || repeats < 1) {
      std::fprintf(stderr, "usage: loco_secure_bench [FLOATS >= 1] [M >= 2] [BANDWIDTH] [REPEATS >= 1]\n");
      return 2;
    }
    crypto_rates();
    LinkConfig link;
    link.bandwidth_bps = parse_bandwidth(bw, "BANDWIDTH");
    auto clock = real_clock();
    std::vector<std::shared_ptr<Transport>> plain, secure;
    for (auto& t : make_inprocess_transports(M)) plain.push_back(wrap_with_link(std::move(t), link, clock));
    MemoryAddressBook book;
    const Key run = derive_run_key("benchmark secret, 32 bytes long.", "bench");
    std::vector<std::future<std::unique_ptr<Transport>>> fs;
    for (int r = 0; r < M; ++r)
      fs.push_back(std::async(std::launch::async, [&, r] {
        return make_secure_transport(book, "b:", run, "1:0", r, M, {"127.0.0.1", 30});
      }));
    for (auto& f : fs) secure.push_back(wrap_with_link(f.get(), link, clock));
    round_time(plain, floats);
    round_time(secure, floats);
    std::vector<double> tp, ts;
    for (int i = 0; i < repeats; ++i) {
      tp.push_back(round_time(plain, floats));
      ts.push_back(round_time(secure, floats));
    }
    const double p = median(tp), s = median(ts);
    std::printf("ring all-reduce of %lld floats among %d members at %s (link model), median of %d:\n",
                static_cast<long long>(floats), M, bw.c_str(), repeats);
    std::printf("  in-process transport %.4f s, secure transport on loopback %.4f s: secure / in-process %.3f\n", p, s,
                s / p);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loco_secure_bench: %s\n", e.what());
    return 1;
  }
}
