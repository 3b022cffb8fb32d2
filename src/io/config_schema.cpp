#include "io/config_schema.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <toml++/toml.h>

#include "core/error.h"

namespace loco {

void ConfigCheck::operator()(bool ok, const std::string& msg) const {
  if (!ok) fail(source + ": " + msg);
}

namespace {

const toml::node& as_node(const void* p) { return *static_cast<const toml::node*>(p); }

// `s` as a TOML basic string: quotes, backslashes and control characters escaped, so that any
// value reads back as itself.
std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string show_double(double v) {
  std::ostringstream ss;
  ss.precision(10);
  ss << v;
  std::string s = ss.str();
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

void walk(const toml::table& t, const std::string& prefix,
          const std::function<void(const std::string&, const toml::node&)>& leaf) {
  for (const auto& [k, v] : t) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const auto* sub = v.as_table())
      walk(*sub, key, leaf);
    else
      leaf(key, v);
  }
}

}  // namespace

void ConfigSchema::add(const std::string& key, int* field, const std::string& help, int64_t min, int64_t max) {
  keys_.push_back({key, help, "integer",
                   [=](const void* p, const std::string& where) {
                     const auto v = as_node(p).value_exact<int64_t>();
                     if (!v) fail(where + ": " + key + " must be an integer");
                     if (*v < min || *v > max)
                       fail(where + ": " + key + " must be in [" + std::to_string(min) + ", " + std::to_string(max) +
                            "], got " + std::to_string(*v));
                     *field = int(*v);
                   },
                   [=] { return std::to_string(*field); }});
}

void ConfigSchema::add(const std::string& key, int64_t* field, const std::string& help, int64_t min, int64_t max) {
  keys_.push_back({key, help, "integer",
                   [=](const void* p, const std::string& where) {
                     const auto v = as_node(p).value_exact<int64_t>();
                     if (!v) fail(where + ": " + key + " must be an integer");
                     if (*v < min || *v > max)
                       fail(where + ": " + key + " must be in [" + std::to_string(min) + ", " + std::to_string(max) +
                            "], got " + std::to_string(*v));
                     *field = *v;
                   },
                   [=] { return std::to_string(*field); }});
}

void ConfigSchema::add(const std::string& key, double* field, const std::string& help, double min, double max) {
  keys_.push_back({key, help, "number",
                   [=](const void* p, const std::string& where) {
                     const auto& n = as_node(p);
                     std::optional<double> v;
                     if (n.is_floating_point())
                       v = n.value<double>();
                     else if (n.is_integer())
                       v = double(*n.value<int64_t>());
                     if (!v) fail(where + ": " + key + " must be a number");
                     if (!(*v >= min && *v <= max))
                       fail(where + ": " + key + " must be in [" + show_double(min) + ", " + show_double(max) +
                            "], got " + show_double(*v));
                     *field = *v;
                   },
                   [=] { return show_double(*field); }});
}

void ConfigSchema::add(const std::string& key, bool* field, const std::string& help) {
  keys_.push_back({key, help, "boolean",
                   [=](const void* p, const std::string& where) {
                     const auto v = as_node(p).value_exact<bool>();
                     if (!v) fail(where + ": " + key + " must be true or false");
                     *field = *v;
                   },
                   [=] { return std::string(*field ? "true" : "false"); }});
}

void ConfigSchema::add(const std::string& key, std::string* field, const std::string& help,
                       std::vector<std::string> allowed) {
  keys_.push_back({key, help, "string",
                   [=](const void* p, const std::string& where) {
                     const auto v = as_node(p).value_exact<std::string>();
                     if (!v) fail(where + ": " + key + " must be a string");
                     if (!allowed.empty()) {
                       bool ok = false;
                       std::string list;
                       for (const auto& a : allowed) {
                         ok |= a == *v;
                         list += (list.empty() ? "" : ", ") + ("\"" + a + "\"");
                       }
                       if (!ok) fail(where + ": " + key + " must be one of " + list + ", got \"" + *v + "\"");
                     }
                     *field = *v;
                   },
                   [=] { return toml_string(*field); }});
}

const ConfigSchema::Key* ConfigSchema::find(const std::string& key) const {
  for (const auto& k : keys_)
    if (k.name == key) return &k;
  return nullptr;
}

bool ConfigSchema::has(const std::string& key) const { return find(key) != nullptr; }

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string ConfigSchema::unknown_key(const std::string& key) const {
  // The nearest key by edit distance, if it is close (a typo, a missing or wrong table).
  const Key* best = nullptr;
  size_t best_d = 0;
  for (const auto& k : keys_) {
    const std::string leaf = k.name.substr(k.name.rfind('.') + 1);
    const size_t d = std::min(edit_distance(key, k.name), edit_distance(key, leaf) + 1);
    if (!best || d < best_d) best = &k, best_d = d;
  }
  const bool close = best && best_d <= std::max<size_t>(2, key.size() / 4);
  return "unknown key " + key + (close ? " (did you mean " + best->name + "?)" : "") +
         " (see loco train --print-config)";
}

void ConfigSchema::load_toml_string(const std::string& text, const std::string& source) {
  toml::table table;
  try {
    table = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    fail(source + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) + ": " + std::string(e.description()));
  }
  walk(table, "", [&](const std::string& key, const toml::node& node) {
    const Key* k = find(key);
    if (!k) fail(source + ": " + unknown_key(key));
    k->set(&node, source);
  });
}

void ConfigSchema::load_toml_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail(path + ": is a directory, not a config file");
  std::ifstream in(path);
  if (!in) fail(path + ": cannot open config file");
  std::stringstream ss;
  ss << in.rdbuf();
  load_toml_string(ss.str(), path);
}

void ConfigSchema::apply_override(const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) fail("--set " + assignment + ": expected key=value");
  const std::string key = assignment.substr(0, eq);
  std::string value = assignment.substr(eq + 1);
  const Key* k = find(key);
  if (!k) fail("--set: " + unknown_key(key));
  if (k->type == "string" && (value.empty() || value.front() != '"')) {
    value = toml_string(value);  // a bare word
  }
  toml::table t;
  try {
    t = toml::parse("v = " + value);
  } catch (const toml::parse_error& e) {
    fail("--set " + key + ": cannot parse value \"" + assignment.substr(eq + 1) + "\"");
  }
  k->set(t.get("v"), "--set");
}

std::string ConfigSchema::print() const {
  std::ostringstream out;
  std::string section;
  for (const auto& k : keys_) {
    const auto dot = k.name.rfind('.');
    const std::string sec = dot == std::string::npos ? "" : k.name.substr(0, dot);
    const std::string leaf = dot == std::string::npos ? k.name : k.name.substr(dot + 1);
    if (sec != section) {
      out << "\n[" << sec << "]\n";
      section = sec;
    }
    out << leaf << " = " << k.show() << "  # " << k.help << "\n";
  }
  return out.str();
}

std::vector<std::pair<std::string, std::string>> ConfigSchema::values() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& k : keys_) out.emplace_back(k.name, k.show());
  return out;
}

}  // namespace loco
