#include "core/lists.h"

#include <sstream>
#include <stdexcept>

#include "core/error.h"

namespace loco {

std::vector<int64_t> parse_int_list(const std::string& text, const std::string& key, int64_t min,
                                    const std::string& what) {
  std::vector<int64_t> values;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size() || v < min) throw std::invalid_argument(item);
      values.push_back(v);
    } catch (const std::exception&) {
      fail(key + ": \"" + item + "\" is not " + what);
    }
  }
  return values;
}

}  // namespace loco
