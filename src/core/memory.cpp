#include "core/memory.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>

#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"
#include "core/parallel.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14 (older headers lack the name)
#endif

namespace loco {

namespace {

// Room for n floats in `v` (not yet touched: a large allocation is fresh pages from the
// kernel), advised as huge-page memory when it is large, and its pages made present by the
// kernel on the compute threads (MADV_POPULATE_WRITE, in pieces of whole huge pages): the first
// touch that follows (the zeros or the copy) then takes no page fault. Both are requests the
// kernel may refuse (an older kernel, no memory to spare yet): the touch then faults the pages
// in itself, as without them.
void reserve_huge(std::vector<float>& v, size_t n) {
  v.reserve(n);
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  if (n * sizeof(float) < (size_t(32) << 20)) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(v.data()) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(v.data() + n) & ~(kHuge - 1);
  if (end <= begin) return;
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  const int64_t pages = int64_t((end - begin) / kHuge);
  parallel_for(pages, 16, [&](int64_t a, int64_t b) {
    madvise(reinterpret_cast<void*>(begin + uintptr_t(a) * kHuge), uintptr_t(b - a) * kHuge, MADV_POPULATE_WRITE);
  });
}

}  // namespace

std::vector<float> zeroed_floats(size_t n) {
  std::vector<float> v;
  reserve_huge(v, n);
  v.resize(n, 0.0f);
  return v;
}

std::vector<float> copied_floats(const std::vector<float>& from) {
  std::vector<float> v;
  reserve_huge(v, from.size());
  v.assign(from.begin(), from.end());
  return v;
}

double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page) : std::numeric_limits<double>::infinity();
}

double address_space_limit_bytes() {
  rlimit r{};
  if (getrlimit(RLIMIT_AS, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return std::numeric_limits<double>::infinity();
  return double(r.rlim_cur);
}

std::string human_size(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  int u = 0;
  while (bytes >= 1000 && u < 5) {
    bytes /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
  return buf;
}

void require_memory(double resident, double reserved, const std::string& what, const std::string& advice) {
  const double physical = physical_memory_bytes();
  if (!std::isfinite(resident) || resident > physical)
    fail(what + " needs " + human_size(resident) + " of memory; this machine has " + human_size(physical) +
         (advice.empty() ? "" : " (" + advice + ")"));
  const double limit = address_space_limit_bytes();
  if (resident + reserved > limit)
    fail(what + " needs about " + human_size(resident + reserved) + " of address space (" + human_size(resident) +
         " of data, " + human_size(reserved) + " of thread stacks and library buffers); the limit (ulimit -v) is " +
         human_size(limit) + (advice.empty() ? "" : " (" + advice + ", or raise the limit)"));
}

}  // namespace loco
