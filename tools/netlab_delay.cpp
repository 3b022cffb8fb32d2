// netlab-delay: a fixed one-way delay for scripts/netlab.sh, whose kernel has no netem. It joins
// two existing TAP devices, one in a lab host's network namespace and one in the hub namespace
// (attached to the lab bridge), and copies Ethernet frames between them: frames the host sends
// are held for DELAY milliseconds, frames towards the host pass at once, so every path between
// two lab hosts has exactly one delayed hop. The host's rate limit is a tbf qdisc on its TAP
// device, ahead of this program. Up to QUEUE frames wait per direction (a router's buffer); more
// are dropped and counted, as a full queue would.
//
// By default both TAPs carry a virtio-net header and accept TCP segmentation and checksum
// offload (TUNSETOFFLOAD), so the kernel hands over a TCP segment of up to 64 KB in one read
// instead of one Ethernet frame per read: at 1 Gbit/s the copying otherwise costs more CPU than a
// 2-core machine has beside the training. tbf still meters every byte (it splits a segment larger
// than its burst into frames); QUEUE then counts segments, not frames. --no-offload copies single
// frames as before.
//
//   netlab-delay [--no-offload] HOST_NS HOST_TAP HUB_NS HUB_TAP DELAY_MS [QUEUE]
//
// Runs until killed (SIGTERM/SIGINT: prints its counters and exits 0).
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

namespace {

volatile sig_atomic_t stop = 0;
void on_signal(int) { stop = 1; }

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "netlab-delay: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

// Attaches to the existing TAP device `dev` inside network namespace `ns` (/run/netns/NS).
int open_tap(const std::string& ns, const std::string& dev, bool offload) {
  const int ns_fd = open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
  if (ns_fd < 0) die("open namespace " + ns);
  if (setns(ns_fd, CLONE_NEWNET) != 0) die("enter namespace " + ns);
  close(ns_fd);
  const int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) die("open /dev/net/tun");
  ifreq ifr{};
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI | (offload ? IFF_VNET_HDR : 0);
  if (dev.size() >= IFNAMSIZ) die("device name too long: " + dev);
  std::strncpy(ifr.ifr_name, dev.c_str(), IFNAMSIZ - 1);
  if (ioctl(fd, TUNSETIFF, &ifr) != 0) die("attach to " + dev + " in " + ns);
  // The header (struct virtio_net_hdr, 10 bytes by default) travels with each segment unchanged:
  // what the sending TAP describes, the receiving TAP rebuilds.
  if (offload && ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6) != 0)
    die("enable offload on " + dev + " in " + ns);
  return fd;
}

using Clock = std::chrono::steady_clock;

struct Frame {
  Clock::time_point due;
  std::vector<unsigned char> bytes;
};

struct Direction {
  int from, to;
  Clock::duration delay;
  size_t limit;
  std::deque<Frame> queue;
  unsigned long long frames = 0, bytes = 0, dropped = 0;

  // Reads every frame waiting on `from`.
  void read_all() {
    static unsigned char buf[1 << 17];  // a 64 KB segment, its Ethernet and virtio-net headers
    for (;;) {
      const ssize_t n = read(from, buf, sizeof buf);
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        die("read");
      }
      if (queue.size() >= limit) {
        ++dropped;
        continue;
      }
      queue.push_back({Clock::now() + delay, std::vector<unsigned char>(buf, buf + n)});
    }
  }
  // Writes the frames that are due; returns milliseconds until the next one (-1: none).
  int flush() {
    const auto now = Clock::now();
    while (!queue.empty() && queue.front().due <= now) {
      const auto& f = queue.front();
      const ssize_t n = write(to, f.bytes.data(), f.bytes.size());
      if (n < 0 && errno != EAGAIN && errno != EIO) die("write");  // EIO: the other side is down
      if (n > 0) {
        ++frames;
        bytes += static_cast<unsigned long long>(n);
      }
      queue.pop_front();
    }
    if (queue.empty()) return -1;
    const auto wait = std::chrono::duration_cast<std::chrono::microseconds>(queue.front().due - now).count();
    return int((wait + 999) / 1000);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const char* prog = argv[0];
  const bool offload = !(argc > 1 && std::strcmp(argv[1], "--no-offload") == 0);
  if (!offload) {
    --argc;
    ++argv;
  }
  if (argc != 6 && argc != 7) {
    std::fprintf(stderr, "usage: %s [--no-offload] HOST_NS HOST_TAP HUB_NS HUB_TAP DELAY_MS [QUEUE]\n", prog);
    return 2;
  }
  char* end = nullptr;
  const double delay_ms = std::strtod(argv[5], &end);
  if (*end != '\0' || !(delay_ms >= 0 && delay_ms <= 10000)) {
    std::fprintf(stderr, "netlab-delay: DELAY_MS must be a number of milliseconds in [0, 10000]\n");
    return 2;
  }
  const long queue = argc == 7 ? std::strtol(argv[6], &end, 10) : 16384;
  if (queue < 1) {
    std::fprintf(stderr, "netlab-delay: QUEUE must be a positive number of frames\n");
    return 2;
  }
  const int host = open_tap(argv[1], argv[2], offload);
  const int hub = open_tap(argv[3], argv[4], offload);
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);
  const auto delay = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(delay_ms));
  Direction out{host, hub, delay, size_t(queue), {}}, in{hub, host, Clock::duration::zero(), size_t(queue), {}};
  while (!stop) {
    int timeout = out.flush();
    const int t2 = in.flush();
    if (timeout < 0 || (t2 >= 0 && t2 < timeout)) timeout = t2;
    pollfd fds[2] = {{host, POLLIN, 0}, {hub, POLLIN, 0}};
    const int r = poll(fds, 2, timeout < 0 ? 200 : timeout);
    if (r < 0 && errno != EINTR) die("poll");
    if (r > 0) {
      if (fds[0].revents & POLLIN) out.read_all();
      if (fds[1].revents & POLLIN) in.read_all();
    }
  }
  std::fprintf(stderr, "netlab-delay %s: out %llu frames %llu bytes (%llu dropped), in %llu frames %llu bytes (%llu dropped)\n",
               argv[2], out.frames, out.bytes, out.dropped, in.frames, in.bytes, in.dropped);
  return 0;
}
