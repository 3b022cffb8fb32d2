#pragma once
// Reading JSON values that come from outside (files, peers, Redis) safely.
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace loco {

// j[key] as an integer: fails, naming `source`, if it is missing or not an integer (a JSON
// float such as 1e57 would otherwise convert with undefined behaviour).
int64_t json_integer(const nlohmann::json& j, const char* key, const std::string& source);

// v as an int64 when it is a JSON integer that fits one (nlohmann reads integers >= 0 as
// unsigned, so a value up to 2^64 - 1 must be compared before converting); else nothing.
std::optional<int64_t> json_whole(const nlohmann::json& v);

}  // namespace loco
