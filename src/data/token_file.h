#pragma once
// LOCOTOKS token files (docs/formats.md). Little-endian:
//   bytes 0-7  "LOCOTOKS"
//   u32        version = 1
//   u32        bytes per token (2 or 4)
//   u64        vocabulary size
//   u64        number of tokens
//   zero padding to byte 64, then the tokens as unsigned integers of the given width.
#include <cstdint>
#include <string>
#include <vector>

namespace loco {

struct TokenFile {
  uint64_t vocab_size = 0;
  std::vector<int32_t> tokens;
};

// Fails with a message naming the file on a bad magic, version, width, size or id >= vocab.
TokenFile read_token_file(const std::string& path);
// The same from the file's bytes (`path` names it in messages).
TokenFile parse_token_file(const std::string& bytes, const std::string& path);
// Uses 2 bytes per token when vocab_size <= 65536, else 4. Atomic.
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens, uint64_t vocab_size);
std::string encode_token_file(const std::vector<int32_t>& tokens, uint64_t vocab_size);

}  // namespace loco

namespace loco {

// Streams tokens to a LOCOTOKS file without holding them in memory: the header is patched
// with the final count by finish(), which also fsyncs and renames the temporary file into
// place (nothing appears at `path` unless finish() succeeds).
class TokenFileWriter {
 public:
  TokenFileWriter(const std::string& path, uint64_t vocab_size);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;
  void append(const int32_t* ids, size_t n);
  void finish();
  uint64_t count() const { return count_; }

 private:
  std::string path_, tmp_;
  uint64_t vocab_size_, count_ = 0;
  uint32_t width_;
  int fd_ = -1;
  std::string buf_;
  void flush();
};

}  // namespace loco
