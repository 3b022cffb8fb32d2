#include "io/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "core/json.h"
#include "core/fs.h"

namespace loco {

namespace {

// fn(where, line) for each line of a JSON Lines file that loco appends to, but an empty one;
// `where` names the file and line for an error. A last line without its newline that is not
// JSON is a write cut short (a crash, a full disk: the writer appends whole lines): it holds no
// record and is left out, so that the run can be resumed and reported (the resume's rewrite
// and the next append_line remove it).
template <class Fn>
void for_each_line(const std::string& path, Fn&& fn) {
  std::ifstream in(path);
  if (!in) fail(path + ": cannot open");
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    if (in.eof() && !nlohmann::json::accept(line)) return;  // ended by the file's end, not by a newline
    fn(path + ":" + std::to_string(n) + ": ", line);
  }
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path, int64_t keep_up_to_step) : path_(path) {
  if (keep_up_to_step >= 0 && file_exists(path)) {
    std::string kept;
    for (const auto& r : read_metric_records(path))
      if (r["step"].get<int64_t>() <= keep_up_to_step) kept += r.dump() + "\n";
    write_file_atomic(path, kept);
    f_ = std::fopen(path.c_str(), "a");
  } else {
    f_ = std::fopen(path.c_str(), "w");
  }
  if (!f_) fail(path + ": cannot open for writing");
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::write(const nlohmann::json& record) {
  const std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    fail(path_ + ": write failed: " + std::strerror(errno));
}

std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::vector<nlohmann::json> out;
  for_each_line(path, [&](const std::string& where, const std::string& line) {
    try {
      out.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception&) {
      fail(where + "not a JSON object");
    }
  });
  return out;
}

std::vector<nlohmann::json> read_metric_records(const std::string& path) {
  std::vector<nlohmann::json> out;
  for_each_line(path, [&](const std::string& where, const std::string& line) {
    nlohmann::json r;
    try {
      r = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      fail(where + "not a JSON object");
    }
    if (!r.is_object()) fail(where + "not a JSON object");
    const auto number = [&](const char* key, bool required, bool null_ok) {
      if (!r.contains(key)) {
        if (required) fail(where + "not a loco metrics record (no " + key + ")");
        return;
      }
      const auto& v = r[key];
      if (v.is_null() && null_ok) return;
      if (!v.is_number() || !std::isfinite(v.get<double>()))
        fail(where + key + " is " + v.dump().substr(0, 40) + ", not a finite number");
    };
    // A whole number that fits int64: nlohmann would wrap a larger unsigned or truncate a float.
    const auto step = r.contains("step") ? json_whole(r["step"]) : std::nullopt;
    if (!step || *step < 0)
      fail(where + "not a loco metrics record (step " + (r.contains("step") ? r["step"].dump().substr(0, 40) : "missing") +
           ", not a whole number >= 0)");
    number("tokens", true, false);
    number("train_loss", true, true);
    number("val_loss", false, true);
    number("time", false, false);
    if (r["tokens"].get<double>() < 0) fail(where + "tokens is negative");
    if (r.contains("time") && r["time"].get<double>() < 0) fail(where + "time is negative");
    out.push_back(std::move(r));
  });
  return out;
}

}  // namespace loco
