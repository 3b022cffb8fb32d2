#pragma once
// safetensors files: u64 little-endian header length, JSON header {name: {dtype, shape,
// data_offsets}, "__metadata__": {string: string}}, then the raw tensor bytes.
// loco writes F32 only and adds "loco.file_checksum" to the metadata: checksum64 (hex) of the
// whole file as written with that value replaced by 16 zeros, so a flipped bit anywhere (the
// header included) is detected. Files of earlier loco versions carry "loco.checksum" (the
// data section only); it is still verified. The reader validates the header strictly: every
// entry well formed, no duplicate names, byte sizes matching dtype and shape, and the ranges
// tiling the data section exactly (no overlap, no gap, nothing outside).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace loco {

struct TensorRef {
  std::string name;
  std::vector<int64_t> shape;
  const float* data;
};

// Serializes and writes atomically.
void write_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

class SafetensorsReader {
 public:
  // require_checksum: fail unless the file carries loco's whole-file checksum (loco's own
  // training state); model files from elsewhere have none.
  explicit SafetensorsReader(const std::string& path, bool require_checksum = false);
  // Parses a file already in memory (`path` names it in messages).
  SafetensorsReader(std::string bytes, const std::string& path, bool require_checksum);
  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  std::vector<std::string> names() const;
  const std::vector<int64_t>& shape(const std::string& name) const;
  const std::string& dtype(const std::string& name) const;
  // Reads an F32 tensor, failing with a message naming the file and tensor on a missing
  // tensor, wrong dtype or a shape other than `expected_shape`.
  std::vector<float> read_f32(const std::string& name, const std::vector<int64_t>& expected_shape) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  const Entry& entry(const std::string& name) const;
  void parse(bool require_checksum);
  std::string path_;
  std::string bytes_;
  uint64_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace loco
