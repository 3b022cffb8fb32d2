#include "data/text_input.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/tokenizer.h"

namespace loco {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Lines of a file through zlib, which passes uncompressed files through unchanged and reads
// concatenated gzip members as one stream.
class LineReader {
 public:
  explicit LineReader(const std::string& path) : path_(path) {
    f_ = gzopen(path.c_str(), "rb");
    if (!f_) fail(path + ": cannot open" + (errno ? std::string(": ") + std::strerror(errno) : std::string()));
    gzbuffer(f_, 1 << 17);
    compressed_ = gzdirect(f_) == 0;
  }
  ~LineReader() {
    if (f_) gzclose(f_);
  }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  bool compressed() const { return compressed_; }
  // The next line without its '\n'; false at the end. A last line without '\n' is a line.
  // `had_newline` tells whether it ended with one.
  bool next(std::string& line, bool& had_newline) {
    line.clear();
    for (;;) {
      if (pos_ == len_) {
        if (!fill()) {
          had_newline = false;
          return !line.empty();
        }
      }
      const char* start = buf_.get() + pos_;
      const void* nl = std::memchr(start, '\n', len_ - pos_);
      if (nl) {
        const size_t n = size_t(static_cast<const char*>(nl) - start);
        line.append(start, n);
        pos_ += n + 1;
        had_newline = true;
        return true;
      }
      line.append(start, len_ - pos_);
      pos_ = len_;
    }
  }

 private:
  bool fill() {
    const int n = gzread(f_, buf_.get(), kBuf);
    if (n < 0 || (n == 0 && !gzeof(f_))) error();
    if (n == 0) {
      int err = Z_OK;
      gzerror(f_, &err);
      if (err != Z_OK && err != Z_STREAM_END) error();
      return false;
    }
    pos_ = 0;
    len_ = size_t(n);
    return true;
  }
  [[noreturn]] void error() {
    int err = Z_OK;
    const char* msg = gzerror(f_, &err);
    if (err == Z_ERRNO) fail(path_ + ": read failed: " + std::strerror(errno));
    std::string why = msg && *msg ? msg : "unknown error";
    if (why.rfind(path_ + ": ", 0) == 0) why = why.substr(path_.size() + 2);  // zlib names the file too
    fail(path_ + ": " + (compressed_ ? "corrupt or truncated gzip data: " : "read failed: ") + why);
  }
  static constexpr int kBuf = 1 << 16;
  std::string path_;
  gzFile f_ = nullptr;
  bool compressed_ = false;
  std::unique_ptr<char[]> buf_{new char[kBuf]};
  size_t pos_ = 0, len_ = 0;
};

}  // namespace

bool is_jsonl_input(const std::string& path, const TextInputOptions& o) {
  if (o.format == "jsonl") return true;
  if (o.format == "text") return false;
  const std::string p = ends_with(path, ".gz") ? path.substr(0, path.size() - 3) : path;
  return ends_with(p, ".jsonl");
}

int64_t for_each_input_line(const std::vector<std::string>& files, const TextInputOptions& o, bool validate,
                            const std::function<void(int64_t, std::string&, int64_t)>& fn) {
  check(o.format == "auto" || o.format == "text" || o.format == "jsonl",
        "--input-format must be auto, text or jsonl, got " + o.format);
  check(!o.jsonl_field.empty(), "--jsonl-field must not be empty");
  int64_t line_index = 0, total = 0, document = 0;
  std::string line, carry, piece;
  bool had_newline = false;
  for (const auto& path : files) {
    LineReader in(path);
    const std::string where = in.compressed() ? " of the decompressed text" : "";
    if (!is_jsonl_input(path, o)) {
      int64_t offset = 0;
      while (in.next(line, had_newline)) {
        if (validate) {
          // A newline never occurs inside a UTF-8 sequence, so lines can be checked one by one.
          auto bad = find_invalid_utf8(line.data(), line.size(), carry);
          if (!bad && !carry.empty()) bad = int64_t(line.size() - carry.size());
          if (bad) fail(path + ": invalid UTF-8 at byte offset " + std::to_string(offset + *bad) + where);
        }
        offset += int64_t(line.size()) + (had_newline ? 1 : 0);
        fn(document, line, line_index++);
      }
      total += offset;
      ++document;
      continue;
    }
    int64_t record = 0;
    while (in.next(line, had_newline)) {
      ++record;
      const std::string at = path + ":" + std::to_string(record) + ": ";
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);  // rejects invalid UTF-8 inside strings
      } catch (const nlohmann::json::exception& e) {
        // nlohmann's message without its id prefix and its echo of the input (which may hold the
        // very bytes that are not UTF-8).
        std::string why = e.what();
        if (const auto cut = why.find("] "); cut != std::string::npos) why = why.substr(cut + 2);
        if (const auto echo = why.find("; last read"); echo != std::string::npos) why.resize(echo);
        if (const auto l1 = why.find("at line 1, "); l1 != std::string::npos) why.erase(l1 + 3, 8);  // one line
        fail(at + "not valid JSON (" + why + ")");
      }
      if (!j.is_object()) fail(at + "not a JSON object");
      const auto it = j.find(o.jsonl_field);
      if (it == j.end()) fail(at + "no field \"" + o.jsonl_field + "\" (set the field with --jsonl-field)");
      if (!it->is_string()) fail(at + "field \"" + o.jsonl_field + "\" is not a string");
      const std::string& text = it->get_ref<const std::string&>();
      total += int64_t(text.size());
      // The document's lines, as if the text were a file of its own.
      size_t start = 0;
      while (start < text.size()) {
        const size_t nl = text.find('\n', start);
        const size_t end = nl == std::string::npos ? text.size() : nl;
        piece.assign(text, start, end - start);
        fn(document, piece, line_index++);
        start = end + 1;
      }
      ++document;
    }
  }
  return total;
}

}  // namespace loco
