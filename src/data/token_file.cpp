#include "data/token_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/fs.h"

namespace loco {

namespace {

constexpr size_t kHeaderSize = 64;

template <class T>
T load_le(const std::string& b, size_t at) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= T(static_cast<unsigned char>(b[at + i])) << (8 * i);
  return v;
}

template <class T>
void store_le(std::string& b, size_t at, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) b[at + i] = char((uint64_t(v) >> (8 * i)) & 0xff);
}

}  // namespace

TokenFile read_token_file(const std::string& path) { return parse_token_file(read_file(path), path); }

TokenFile parse_token_file(const std::string& b, const std::string& path) {
  if (b.size() < kHeaderSize) fail(path + ": not a LOCOTOKS file (shorter than the 64-byte header)");
  if (b.compare(0, 8, "LOCOTOKS") != 0) fail(path + ": not a LOCOTOKS file (bad magic)");
  const uint32_t version = load_le<uint32_t>(b, 8);
  if (version != 1) fail(path + ": unsupported LOCOTOKS version " + std::to_string(version) + " (expected 1)");
  const uint32_t width = load_le<uint32_t>(b, 12);
  if (width != 2 && width != 4) fail(path + ": bytes per token must be 2 or 4, got " + std::to_string(width));
  TokenFile tf;
  tf.vocab_size = load_le<uint64_t>(b, 16);
  const uint64_t count = load_le<uint64_t>(b, 24);
  if (tf.vocab_size == 0 || tf.vocab_size > uint64_t(INT32_MAX))
    fail(path + ": vocabulary size " + std::to_string(tf.vocab_size) + " is out of range");
  if (width == 2 && tf.vocab_size > 65536)
    fail(path + ": vocabulary size " + std::to_string(tf.vocab_size) + " does not fit 2-byte tokens");
  const uint64_t payload = b.size() - kHeaderSize;
  if (count > payload / width || payload != count * width)
    fail(path + ": file size " + std::to_string(b.size()) + " does not match " + std::to_string(count) + " tokens of " +
         std::to_string(width) + " bytes (truncated or corrupt)");
  tf.tokens.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t id = width == 2 ? load_le<uint16_t>(b, kHeaderSize + 2 * i) : load_le<uint32_t>(b, kHeaderSize + 4 * i);
    if (id >= tf.vocab_size)
      fail(path + ": token " + std::to_string(i) + " has id " + std::to_string(id) + " >= vocabulary size " +
           std::to_string(tf.vocab_size));
    tf.tokens[i] = int32_t(id);
  }
  return tf;
}

std::string encode_token_file(const std::vector<int32_t>& tokens, uint64_t vocab_size) {
  check(vocab_size >= 1 && vocab_size <= uint64_t(INT32_MAX), "token file: vocabulary size out of range");
  const uint32_t width = vocab_size <= 65536 ? 2 : 4;
  std::string b(kHeaderSize + tokens.size() * width, '\0');
  std::memcpy(b.data(), "LOCOTOKS", 8);
  store_le<uint32_t>(b, 8, 1);
  store_le<uint32_t>(b, 12, width);
  store_le<uint64_t>(b, 16, vocab_size);
  store_le<uint64_t>(b, 24, tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    check(tokens[i] >= 0 && uint64_t(tokens[i]) < vocab_size,
          "token file: id " + std::to_string(tokens[i]) + " >= vocabulary size " + std::to_string(vocab_size));
    if (width == 2)
      store_le<uint16_t>(b, kHeaderSize + 2 * i, uint16_t(tokens[i]));
    else
      store_le<uint32_t>(b, kHeaderSize + 4 * i, uint32_t(tokens[i]));
  }
  return b;
}

TokenFileWriter::TokenFileWriter(const std::string& path, uint64_t vocab_size)
    : path_(path), tmp_(path + ".tmp." + std::to_string(::getpid())), vocab_size_(vocab_size),
      width_(vocab_size <= 65536 ? 2 : 4) {
  check(vocab_size >= 1 && vocab_size <= uint64_t(INT32_MAX), path + ": vocabulary size out of range");
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(tmp_ + ": cannot create: " + std::strerror(errno));
  buf_.assign(kHeaderSize, '\0');  // patched by finish()
}

TokenFileWriter::~TokenFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void TokenFileWriter::append(const int32_t* ids, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    check(ids[i] >= 0 && uint64_t(ids[i]) < vocab_size_,
          path_ + ": token id " + std::to_string(ids[i]) + " >= vocabulary size " + std::to_string(vocab_size_));
    const uint32_t v = uint32_t(ids[i]);
    for (uint32_t b = 0; b < width_; ++b) buf_.push_back(char((v >> (8 * b)) & 0xff));
  }
  count_ += n;
  if (buf_.size() >= (1u << 20)) flush();
}

void TokenFileWriter::flush() {
  const char* p = buf_.data();
  size_t left = buf_.size();
  while (left > 0) {
    const ssize_t w = ::write(fd_, p, left);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(tmp_ + ": write failed: " + std::strerror(errno));
    }
    p += w;
    left -= size_t(w);
  }
  buf_.clear();
}

void TokenFileWriter::finish() {
  flush();
  std::string header(kHeaderSize, '\0');
  std::memcpy(header.data(), "LOCOTOKS", 8);
  store_le<uint32_t>(header, 8, 1);
  store_le<uint32_t>(header, 12, width_);
  store_le<uint64_t>(header, 16, vocab_size_);
  store_le<uint64_t>(header, 24, count_);
  if (::pwrite(fd_, header.data(), kHeaderSize, 0) != ssize_t(kHeaderSize))
    fail(tmp_ + ": header write failed: " + std::strerror(errno));
  if (::fsync(fd_) != 0) fail(tmp_ + ": fsync failed: " + std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    fail(path_ + ": rename failed: " + std::strerror(err));
  }
}

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, uint64_t vocab_size) {
  write_file_atomic(path, encode_token_file(tokens, vocab_size));
}

}  // namespace loco
