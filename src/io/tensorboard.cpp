#include "io/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/checksum.h"
#include "core/error.h"
#include "core/fs.h"

namespace loco {

namespace {

// Protocol buffer wire format: a field key is (number << 3) | wire type (0 varint, 1 64-bit,
// 2 length-delimited, 5 32-bit).
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void put_key(std::string& out, int field, int wire) { put_varint(out, uint64_t(field) << 3 | uint64_t(wire)); }
template <typename T>
void put_fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian host (x86-64), as the wire format is
  out.append(b, sizeof(T));
}
void put_bytes(std::string& out, int field, const std::string& s) {
  put_key(out, field, 2);
  put_varint(out, s.size());
  out += s;
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event { double wall_time = 1; int64 step = 2; oneof { string file_version = 3; Summary
// summary = 5; SessionLog session_log = 6; } }
std::string event(int64_t step, int field, const std::string& payload) {
  std::string e;
  put_key(e, 1, 1);
  put_fixed(e, unix_seconds());
  if (step != 0) {  // proto3 leaves a zero out
    put_key(e, 2, 0);
    put_varint(e, uint64_t(step));
  }
  put_bytes(e, field, payload);
  return e;
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tf_record(const std::string& data) {
  std::string r;
  const uint64_t len = data.size();
  put_fixed(r, len);
  put_fixed(r, masked_crc32c(r.data(), sizeof len));
  r += data;
  put_fixed(r, masked_crc32c(data.data(), data.size()));
  return r;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t resume_step) {
  char host[256] = "localhost";
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  // Readers (TensorBoard, loco's) take a run's event files in name order: a resumed run's file
  // must sort after the earlier ones, also when it starts within the same second (the names
  // would then differ only by process id, in no particular order).
  int64_t seconds = int64_t(unix_seconds());
  const std::string prefix = "events.out.tfevents.";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const int64_t earlier = std::atoll(name.c_str() + prefix.size());
    if (earlier >= seconds) seconds = earlier + 1;
  }
  path_ = dir + "/" + prefix + std::to_string(seconds) + "." + host + "." + std::to_string(::getpid()) + ".loco";
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_) fail(path_ + ": cannot open for writing");
  write_event(event(0, 3, "brain.Event:2"));
  if (resume_step >= 0) {
    std::string log;  // SessionLog { SessionStatus status = 1 (START = 1); }
    put_key(log, 1, 0);
    put_varint(log, 1);
    write_event(event(resume_step, 6, log));
  }
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::write_event(const std::string& e) {
  const std::string r = tf_record(e);
  if (std::fwrite(r.data(), 1, r.size(), f_) != r.size()) fail(path_ + ": write failed: " + std::strerror(errno));
}

void TensorBoardWriter::scalar(int64_t step, const std::string& tag, double value) {
  std::string v;  // Summary.Value { string tag = 1; float simple_value = 2; }
  put_bytes(v, 1, tag);
  put_key(v, 2, 5);
  put_fixed(v, float(value));
  std::string summary;  // Summary { repeated Value value = 1; }
  put_bytes(summary, 1, v);
  write_event(event(step, 5, summary));
}

void TensorBoardWriter::flush() {
  if (std::fflush(f_) != 0) fail(path_ + ": write failed: " + std::strerror(errno));
}

}  // namespace loco
