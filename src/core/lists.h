#pragma once
// Parsing the comma-separated lists of settings (streaming.worker_tau, pipeline partitions, a
// checkpoint's pending fragments).
#include <cstdint>
#include <string>
#include <vector>

namespace loco {

// Integers from a comma-separated list such as "1,1,3,3", each >= `min`; errors name `key`
// and say that `what` was expected.
std::vector<int64_t> parse_int_list(const std::string& text, const std::string& key, int64_t min,
                                    const std::string& what);

}  // namespace loco
