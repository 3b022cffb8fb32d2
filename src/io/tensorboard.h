#pragma once
// TensorBoard event files (docs/formats.md): TFRecord framing (length, masked CRC-32C of the
// length, data, masked CRC-32C of the data) around Event protocol buffers holding scalar
// summaries. Written by hand (a few fields of two messages), so loco needs no protobuf library.
#include <cstdint>
#include <cstdio>
#include <string>

namespace loco {

// TFRecord's masking of a CRC-32C (core/checksum.h): ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);
// One TFRecord around `data`.
std::string tf_record(const std::string& data);

class TensorBoardWriter {
 public:
  // Creates DIR/events.out.tfevents.<unix seconds>.<host>.<pid>.loco and writes the file-version
  // event. resume_step >= 0 adds a SessionLog START at that step: TensorBoard then discards the
  // earlier files' events past it (written after the checkpoint the run resumed from).
  TensorBoardWriter(const std::string& dir, int64_t resume_step);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // A scalar summary (float32, as TensorBoard stores it) at `step`; flush() makes the records
  // written so far visible to a reader.
  void scalar(int64_t step, const std::string& tag, double value);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event);
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace loco
