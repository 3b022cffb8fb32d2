#include "core/json.h"

#include <cstdint>

#include "core/error.h"

namespace loco {

int64_t json_integer(const nlohmann::json& j, const char* key, const std::string& source) {
  if (!j.is_object() || !j.contains(key)) fail(source + ": missing \"" + key + "\"");
  const auto& v = j.at(key);
  if (const auto n = json_whole(v)) return *n;
  fail(source + ": \"" + key + "\" must be an integer, got " + v.dump());
}

std::optional<int64_t> json_whole(const nlohmann::json& v) {
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > uint64_t(INT64_MAX)) return std::nullopt;
    return int64_t(v.get<uint64_t>());
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return std::nullopt;
}

}  // namespace loco
