#pragma once
// Typed, documented configuration keys bound to struct fields. One schema drives the TOML
// reader, `--set key=value` overrides and `--print-config`, so that every key is validated the
// same way and every error names the key.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace loco {

// A check across keys of a configuration read from `source`: need(ok, msg) fails with
// "source: msg" unless ok.
struct ConfigCheck {
  std::string source;
  void operator()(bool ok, const std::string& msg) const;
};

class ConfigSchema {
 public:
  void add(const std::string& key, int* field, const std::string& help, int64_t min = INT32_MIN,
           int64_t max = INT32_MAX);
  void add(const std::string& key, int64_t* field, const std::string& help, int64_t min = INT64_MIN,
           int64_t max = INT64_MAX);
  void add(const std::string& key, double* field, const std::string& help, double min = -1e308, double max = 1e308);
  void add(const std::string& key, bool* field, const std::string& help);
  // allowed empty: any string.
  void add(const std::string& key, std::string* field, const std::string& help,
           std::vector<std::string> allowed = {});

  // Reads a TOML file: every leaf must be a known key of the right type and range.
  void load_toml_file(const std::string& path);
  void load_toml_string(const std::string& text, const std::string& source);
  // Applies "key=value" (value in TOML syntax; bare words are taken as strings).
  void apply_override(const std::string& assignment);
  // Every key with its current value and meaning, as TOML with comments.
  std::string print() const;
  // Every key with its current value as printed (TOML syntax), in schema order.
  std::vector<std::pair<std::string, std::string>> values() const;
  bool has(const std::string& key) const;

  struct Key {
    std::string name, help, type;
    // Sets from a TOML value (as text of a TOML document "v = ..."), failing with `where`.
    std::function<void(const void* node, const std::string& where)> set;
    std::function<std::string()> show;
  };

 private:
  const Key* find(const std::string& key) const;
  // "unknown key KEY", with the nearest known key when one is close.
  std::string unknown_key(const std::string& key) const;
  std::vector<Key> keys_;
};

}  // namespace loco
