#pragma once
// Memory the machine offers, checked before large allocations so that an impossible request
// fails with a message naming what needs the memory, instead of std::bad_alloc, a swap storm or
// a library spinning on a failed allocation.
#include <cstddef>
#include <string>
#include <vector>

namespace loco {

// n zeros, in memory the kernel may back with transparent huge pages (madvise, for buffers of
// 32 MiB or more): the first touch of a model-sized buffer then takes one page fault per 2 MiB
// instead of per 4 KiB (on this project's 2-core AMD EPYC VM, 1 GiB in 0.75-0.96 s against
// 3.0-4.6 s), and the buffer needs fewer TLB entries; its pages are made present by the kernel
// on the compute threads before they are touched (docs/results/host-buffers.md). The same values
// as std::vector<float>(n).
std::vector<float> zeroed_floats(size_t n);
// A copy of `from` in such memory.
std::vector<float> copied_floats(const std::vector<float>& from);

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
