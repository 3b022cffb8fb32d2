#pragma once
// safetensors files: u64 little-endian header length, JSON header {name: {dtype, shape,
// data_offsets}, "__metadata__": {string: string}}, then the raw tensor bytes.
// loco writes F32 only and adds "loco.checksum" (checksum64 of the data section, hex) to the
// metadata; the reader verifies it when present and validates every entry.
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
  explicit SafetensorsReader(const std::string& path);
  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  std::vector<std::string> names() const;
  const std::vector<int64_t>& shape(const std::string& name) const;
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
  std::string path_;
  std::string bytes_;
  uint64_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace loco
