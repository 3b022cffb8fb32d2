#include "report/run_data.h"

#include <toml++/toml.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "algo/methods.h"
#include "io/metrics.h"

namespace loco::report {

namespace {

using nlohmann::json;

// A value as TOML text, for values whose source text cannot be taken from the file.
std::string toml_value(const toml::node& n) {
  if (auto s = n.as_string()) {
    std::string o = "\"";
    for (char c : s->get()) o += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    return o + "\"";
  }
  if (auto i = n.as_integer()) return std::to_string(i->get());
  if (auto f = n.as_floating_point()) {  // the shortest text that reads back as the same double
    char b[64];
    const auto r = std::to_chars(b, b + sizeof b, f->get());
    return std::string(b, r.ptr);
  }
  if (auto b = n.as_boolean()) return b->get() ? "true" : "false";
  if (auto a = n.as_array()) {
    std::string o = "[";
    for (size_t i = 0; i < a->size(); ++i) o += (i ? ", " : "") + toml_value(*a->get(i));
    return o + "]";
  }
  return "?";
}

// The value's text as written in the file (a value on one line), else toml_value.
std::string as_written(const toml::node& n, const std::vector<std::string>& lines) {
  const auto& src = n.source();
  if (src.begin.line >= 1 && src.begin.line == src.end.line && src.begin.line <= lines.size() &&
      src.end.column > src.begin.column) {
    const std::string& line = lines[src.begin.line - 1];
    const size_t from = src.begin.column - 1, count = src.end.column - src.begin.column;
    if (from + count <= line.size()) return line.substr(from, count);
  }
  return toml_value(n);
}

void flatten(const toml::table& t, const std::string& prefix, const std::vector<std::string>& lines,
             std::map<std::string, std::string>& out) {
  for (const auto& [k, v] : t) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (auto sub = v.as_table())
      flatten(*sub, key, lines, out);
    else
      out[key] = as_written(v, lines);
  }
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

double num_or(const json& j, const char* key, double fallback) {
  return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<double>() : fallback;
}

std::string str_or(const json& j, const char* key, const std::string& fallback) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
}

std::string Run::setting(const std::string& key) const {
  const auto it = config.find(key);
  if (it == config.end()) return "";
  const std::string& v = it->second;
  return v.size() >= 2 && v.front() == '"' && v.back() == '"' ? v.substr(1, v.size() - 2) : v;
}

std::string Run::backend() const {
  const std::string b = str_or(summary, "backend", "");
  return b.empty() ? setting("distributed.backend") : b;
}

nlohmann::json read_summary(const std::string& path) {
  nlohmann::json s = read_json_file(path);
  if (!s.is_object() || !s.contains("workers") || !s["workers"].is_array())
    fail(path + ": not a loco run summary (no workers list)");
  if (s["workers"].empty()) fail(path + ": not a loco run summary (an empty workers list)");
  const auto text = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return std::string(b);
  };
  // A value the report prints or counts with: a number (or a whole number) in [lo, hi].
  const auto check = [&](const nlohmann::json& j, const char* key, const std::string& where, double lo, double hi,
                         bool whole) {
    if (!j.contains(key) || j[key].is_null()) return;
    const auto& v = j[key];
    const auto n = whole ? json_whole(v) : std::nullopt;
    const bool ok = whole ? n && double(*n) >= lo && double(*n) <= hi
                          : v.is_number() && v.get<double>() >= lo && v.get<double>() <= hi;
    if (!ok)
      fail(path + ": " + where + key + " is " + v.dump().substr(0, 40) + ", not a " + (whole ? "whole " : "") +
           "number in [" + text(lo) + ", " + text(hi) + "]");
  };
  constexpr double kMaxCount = 1e6, kMaxTotal = 9e15;
  check(s, "replicas", "", 1, kMaxCount, true);
  check(s, "stages", "", 1, kMaxCount, true);
  check(s, "steps", "", 0, kMaxTotal, true);
  check(s, "tokens", "", 0, kMaxTotal, true);
  check(s, "seconds", "", 0, 1e12, false);
  for (size_t i = 0; i < s["workers"].size(); ++i) {
    const auto& w = s["workers"][i];
    const std::string where = "workers[" + std::to_string(i) + "].";
    if (!w.is_object()) fail(path + ": workers[" + std::to_string(i) + "] is not an object");
    for (const char* key : {"rank", "stage", "replica"}) check(w, key, where, 0, kMaxCount, true);
    for (const char* key : {"bytes_sent", "bytes_received", "peak_send_bytes_per_s", "compute_s", "comm_wait_s",
                            "bubble_s", "param_bytes", "forward_s_per_step", "backward_s_per_step",
                            "optimizer_s_per_step", "wall_s", "eval_s", "checkpoint_s", "steps_run"})
      check(w, key, where, 0, 1e18, false);
    check(w, "compute_utilization", where, 0, 1, false);
    check(w, "bubble_share", where, 0, 1, false);
    if (w.contains("by_operation")) {
      if (!w["by_operation"].is_object()) fail(path + ": " + where + "by_operation is not an object");
      for (const auto& [op, v] : w["by_operation"].items()) {
        if (!v.is_object()) fail(path + ": " + where + "by_operation." + op + " is not an object");
        for (const char* key : {"bytes_sent", "bytes_received", "messages_sent", "largest_instance_bytes_sent"})
          check(v, key, where + "by_operation." + op + ".", 0, 1e18, false);
      }
    }
  }
  return s;
}

const nlohmann::json& required(const nlohmann::json& j, const char* key, const std::string& source,
                               const std::string& where) {
  // A null is no value (read_summary leaves it unchecked, as the report prints it as missing).
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) fail(source + ": " + where + " has no " + key);
  return j[key];
}

Run load_run(const std::string& dir) {
  Run r;
  r.dir = dir;
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  r.name = std::filesystem::path(trimmed).filename().string();
  if (r.name.empty() || r.name == "." || r.name == "..") r.name = trimmed;
  const std::string mpath = dir + "/metrics.jsonl";
  if (!file_exists(mpath)) fail(dir + ": not a loco run directory (no metrics.jsonl)");
  r.metrics = read_metric_records(mpath);
  if (file_exists(dir + "/summary.json")) {
    r.summary = read_summary(dir + "/summary.json");
  }
  if (file_exists(dir + "/invocations.jsonl")) {
    r.invocations = read_metrics(dir + "/invocations.jsonl");  // JSON Lines, checked line by line
    for (size_t i = 0; i < r.invocations.size(); ++i)
      if (!r.invocations[i].is_object())
        fail(dir + "/invocations.jsonl:" + std::to_string(i + 1) + ": not a JSON object");
  }
  if (file_exists(dir + "/config.toml")) {
    r.config_text = read_file(dir + "/config.toml");
    std::vector<std::string> lines;
    std::istringstream in(r.config_text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    try {
      flatten(toml::parse(r.config_text, dir + "/config.toml"), "", lines, r.config);
    } catch (const toml::parse_error& e) {
      fail(dir + "/config.toml: " + std::string(e.description()));
    }
  }
  return r;
}

bool key_applies(const std::string& key, const Run& r) {
  if (r.config.empty()) return true;  // nothing to judge by
  const auto algo = find_method(r.setting("algorithm"));
  const bool outer_method = algo == MethodId::Diloco || algo == MethodId::Streaming;
  const bool pipeline = r.setting("pipeline.stages") != "" && r.setting("pipeline.stages") != "1";
  if (starts_with(key, "outer.")) {
    if (key == "outer.start_step") return algo == MethodId::Diloco;
    if (key == "outer.inner_steps" || key == "outer.lr" || key == "outer.momentum" || key == "outer.nesterov")
      return outer_method;
    return algo == MethodId::Streaming;  // the codec and how encoded outer gradients are combined
  }
  if (starts_with(key, "streaming.")) return algo == MethodId::Streaming;
  if (starts_with(key, "noloco.")) return algo == MethodId::Noloco && (key != "noloco.routing" || pipeline);
  if (starts_with(key, "elastic.")) return r.backend() == "elastic";
  if (starts_with(key, "pipeline.") && key != "pipeline.stages") return pipeline;
  if (starts_with(key, "protocol.") && key != "protocol.rank") return r.setting("protocol.rank") != "0";
  if (key == "partial.strategy") return r.setting("partial.slices") != "1";
  if (key == "network.tcp") return r.setting("network.bandwidth") != "inf";  // TCP is emulated on a link
  return true;
}

std::string network_text(const Run& r) {
  const std::string bw = r.setting("network.bandwidth"), lat = r.setting("network.latency");
  if (bw.empty() && lat.empty()) return "-";
  const bool no_bw = bw.empty() || bw == "inf", no_lat = lat.empty() || lat == "0ms" || lat == "0s" || lat == "0";
  if (no_bw && no_lat) return "none";
  std::string o = no_bw ? "unlimited" : bw;
  o += ", " + (no_lat ? std::string("0 latency") : lat);
  if (!no_bw) o += r.setting("network.tcp") == "true" ? ", TCP" : ", ideal pipe";
  return o;
}

}  // namespace loco::report
