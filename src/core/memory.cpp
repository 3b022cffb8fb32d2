#include "core/memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"

namespace loco {

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
