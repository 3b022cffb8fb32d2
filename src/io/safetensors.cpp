#include "io/safetensors.h"

#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "io/fs.h"

namespace loco {

static std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

static int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

void write_safetensors(const std::string& path, const std::vector<TensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  uint64_t offset = 0;
  std::string data;
  for (const auto& t : tensors) {
    const uint64_t bytes = uint64_t(numel(t.shape)) * 4;
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  data.resize(offset);
  offset = 0;
  for (const auto& t : tensors) {
    const uint64_t bytes = uint64_t(numel(t.shape)) * 4;
    if (bytes) std::memcpy(data.data() + offset, t.data, bytes);
    offset += bytes;
  }
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  for (const auto& [k, v] : metadata) meta[k] = v;
  meta["loco.checksum"] = hex64(checksum64(data.data(), data.size()));
  header["__metadata__"] = meta;
  std::string h = header.dump();
  // Pad the header with spaces so the data section starts 8-byte aligned.
  while ((8 + h.size()) % 8) h.push_back(' ');
  std::string out(8, '\0');
  const uint64_t hlen = h.size();
  for (int i = 0; i < 8; ++i) out[i] = char((hlen >> (8 * i)) & 0xff);
  out += h;
  out += data;
  write_file_atomic(path, out);
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  bytes_ = read_file(path);
  if (bytes_.size() < 8) fail(path + ": not a safetensors file (shorter than 8 bytes)");
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= uint64_t(static_cast<unsigned char>(bytes_[i])) << (8 * i);
  if (hlen > bytes_.size() - 8) fail(path + ": truncated safetensors file (header length " + std::to_string(hlen) +
                                     " exceeds file size " + std::to_string(bytes_.size()) + ")");
  data_start_ = 8 + hlen;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes_.begin() + 8, bytes_.begin() + std::ptrdiff_t(data_start_));
  } catch (const nlohmann::json::exception&) {
    fail(path + ": corrupt safetensors header (invalid JSON)");
  }
  if (!header.is_object()) fail(path + ": corrupt safetensors header (not a JSON object)");
  const uint64_t data_size = bytes_.size() - data_start_;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) fail(path + ": __metadata__ must be an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) fail(path + ": __metadata__ value of \"" + m.key() + "\" must be a string");
        metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const auto& e = *it;
    const std::string where = path + ": tensor \"" + it.key() + "\"";
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      fail(where + ": entry needs dtype, shape and data_offsets");
    Entry ent;
    try {
      ent.dtype = e["dtype"].get<std::string>();
      ent.shape = e["shape"].get<std::vector<int64_t>>();
      const auto off = e["data_offsets"].get<std::vector<uint64_t>>();
      if (off.size() != 2) fail(where + ": data_offsets must have 2 entries");
      ent.begin = off[0];
      ent.end = off[1];
    } catch (const nlohmann::json::exception&) {
      fail(where + ": malformed entry");
    }
    for (auto d : ent.shape)
      if (d < 0) fail(where + ": negative dimension");
    if (ent.begin > ent.end || ent.end > data_size)
      fail(where + ": data range [" + std::to_string(ent.begin) + ", " + std::to_string(ent.end) +
           ") is outside the data section of " + std::to_string(data_size) + " bytes (truncated file?)");
    entries_[it.key()] = ent;
  }
  auto ck = metadata_.find("loco.checksum");
  if (ck != metadata_.end()) {
    const std::string actual = hex64(checksum64(bytes_.data() + data_start_, data_size));
    if (actual != ck->second)
      fail(path + ": checksum mismatch (file is corrupt or was truncated): expected " + ck->second + ", got " +
           actual);
  }
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : entries_) out.push_back(k);
  return out;
}

const SafetensorsReader::Entry& SafetensorsReader::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail(path_ + ": missing tensor \"" + name + "\"");
  return it->second;
}

const std::vector<int64_t>& SafetensorsReader::shape(const std::string& name) const { return entry(name).shape; }

std::vector<float> SafetensorsReader::read_f32(const std::string& name,
                                               const std::vector<int64_t>& expected_shape) const {
  const Entry& e = entry(name);
  const std::string where = path_ + ": tensor \"" + name + "\"";
  if (e.dtype != "F32") fail(where + " has dtype " + e.dtype + ", expected F32");
  if (e.shape != expected_shape)
    fail(where + " has shape " + shape_str(e.shape) + ", expected " + shape_str(expected_shape));
  const uint64_t n = uint64_t(numel(e.shape));
  if (e.end - e.begin != n * 4)
    fail(where + ": byte size " + std::to_string(e.end - e.begin) + " does not match shape " + shape_str(e.shape));
  std::vector<float> out(n);
  if (n) std::memcpy(out.data(), bytes_.data() + data_start_ + e.begin, n * 4);
  return out;
}

}  // namespace loco
