#pragma once
// Memory the machine offers, checked before large allocations so that an impossible request
// fails with a message naming what needs the memory, instead of std::bad_alloc, a swap storm or
// a library spinning on a failed allocation.
#include <string>

namespace loco {

double physical_memory_bytes();
// The address-space limit of this process (ulimit -v), or infinity.
double address_space_limit_bytes();

// Fails with "`what` needs X of memory; this machine has Y" when `resident` bytes exceed the
// physical memory, or `resident + reserved` bytes (reserved: address space taken without being
// used, such as thread stacks and library buffers) exceed the address-space limit. `advice`
// says which settings lower the need.
void require_memory(double resident, double reserved, const std::string& what, const std::string& advice);

std::string human_size(double bytes);  // "1.5 GB"

}  // namespace loco
