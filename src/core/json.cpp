#include "core/json.h"

#include <cstdint>

#include "core/error.h"

namespace loco {

int64_t json_integer(const nlohmann::json& j, const char* key, const std::string& source) {
  if (!j.is_object() || !j.contains(key)) fail(source + ": missing \"" + key + "\"");
  const auto& v = j.at(key);
  if (v.is_number_unsigned() && v.get<uint64_t>() <= uint64_t(INT64_MAX)) return int64_t(v.get<uint64_t>());
  if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<int64_t>();
  fail(source + ": \"" + key + "\" must be an integer, got " + v.dump());
}

}  // namespace loco
