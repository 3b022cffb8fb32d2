#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace loco {

// Writes `bytes` to `path` atomically: temporary file in the same directory, fsync, rename,
// fsync of the directory. A crash at any moment leaves either the old or the new file.
void write_file_atomic(const std::string& path, std::string_view bytes);
std::string read_file(const std::string& path);
// Parses a JSON file; a syntax error fails with "PATH: invalid JSON".
nlohmann::json read_json_file(const std::string& path);
// j[key] as an integer: fails, naming `source`, if it is missing or not an integer (a JSON
// float such as 1e57 would otherwise convert with undefined behaviour).
int64_t json_integer(const nlohmann::json& j, const char* key, const std::string& source);
void make_dirs(const std::string& path);
// Appends `line` and a newline to `path` (created if missing) in one write.
void append_line(const std::string& path, const std::string& line);
bool file_exists(const std::string& path);

// 64-bit FNV-1a over 8-byte little-endian words (tail bytes folded one by one): a fast
// checksum for detecting torn or corrupted files, not a cryptographic hash.
uint64_t checksum64(const void* data, size_t size);

}  // namespace loco
