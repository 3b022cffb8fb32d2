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
void make_dirs(const std::string& path);
// Appends `line` and a newline to `path` (created if missing) in one write, after removing a
// last line that an earlier append left cut short (no newline, not JSON).
void append_line(const std::string& path, const std::string& line);
bool file_exists(const std::string& path);

}  // namespace loco
