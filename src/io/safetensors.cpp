#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/checksum.h"
#include "core/error.h"
#include "core/fs.h"

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

namespace {

constexpr const char* kFileChecksum = "loco.file_checksum";
const std::string kZeros(16, '0');

// Bytes per element of the safetensors dtypes.
int dtype_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2") return 1;
  return 0;
}

// Where the value of "loco.file_checksum" sits in the header text (npos if absent).
size_t checksum_value_at(const std::string& header) {
  const std::string key = std::string("\"") + kFileChecksum + "\":\"";
  const size_t at = header.rfind(key);  // the metadata is written last
  return at == std::string::npos ? at : at + key.size();
}

}  // namespace

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
  meta[kFileChecksum] = kZeros;
  header["__metadata__"] = meta;
  std::string h = header.dump();
  // Pad the header with spaces so the data section starts 8-byte aligned.
  while ((8 + h.size()) % 8) h.push_back(' ');
  std::string out(8, '\0');
  const uint64_t hlen = h.size();
  for (int i = 0; i < 8; ++i) out[i] = char((hlen >> (8 * i)) & 0xff);
  out += h;
  out += data;
  // The checksum of the whole file with zeros in its own place, then written there.
  const size_t at = 8 + checksum_value_at(h);
  out.replace(at, kZeros.size(), hex64(checksum64(out.data(), out.size())));
  write_file_atomic(path, out);
}

SafetensorsReader::SafetensorsReader(const std::string& path, bool require_checksum) : path_(path) {
  bytes_ = read_file(path);
  parse(require_checksum);
}

SafetensorsReader::SafetensorsReader(std::string bytes, const std::string& path, bool require_checksum)
    : path_(path), bytes_(std::move(bytes)) {
  parse(require_checksum);
}

void SafetensorsReader::parse(bool require_checksum) {
  const std::string& path = path_;
  if (bytes_.size() < 8) fail(path + ": not a safetensors file (shorter than 8 bytes)");
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= uint64_t(static_cast<unsigned char>(bytes_[i])) << (8 * i);
  if (hlen > bytes_.size() - 8) fail(path + ": truncated safetensors file (header length " + std::to_string(hlen) +
                                     " exceeds file size " + std::to_string(bytes_.size()) + ")");
  data_start_ = 8 + hlen;
  const std::string header_text = bytes_.substr(8, hlen);
  // Duplicate names would silently replace each other in a JSON object: count every key.
  std::map<std::string, int> seen_keys;
  std::string duplicate;
  auto note_keys = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && ++seen_keys[parsed.get<std::string>()] == 2)
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_text, note_keys);
  } catch (const nlohmann::json::exception&) {
    fail(path + ": corrupt safetensors header (invalid JSON)");
  }
  if (!header.is_object()) fail(path + ": corrupt safetensors header (not a JSON object)");
  if (!duplicate.empty()) fail(path + ": the header lists \"" + duplicate + "\" twice");
  const uint64_t data_size = bytes_.size() - data_start_;
  std::vector<std::pair<std::pair<uint64_t, uint64_t>, std::string>> ranges;
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
    // Integers only: converting a JSON float (1e57) to an integer would be undefined.
    auto integers = [&](const nlohmann::json& a, const char* key, bool allow_negative) {
      if (!a.is_array()) fail(where + ": " + key + " must be a list of integers");
      for (const auto& x : a)
        if (!(x.is_number_unsigned() || (allow_negative && x.is_number_integer())))
          fail(where + ": " + key + " must be a list of " + (allow_negative ? "integers" : "non-negative integers"));
    };
    if (!e["dtype"].is_string()) fail(where + ": dtype must be a string");
    integers(e["shape"], "shape", true);
    integers(e["data_offsets"], "data_offsets", false);
    ent.dtype = e["dtype"].get<std::string>();
    ent.shape = e["shape"].get<std::vector<int64_t>>();
    const auto off = e["data_offsets"].get<std::vector<uint64_t>>();
    if (off.size() != 2) fail(where + ": data_offsets must have 2 entries");
    ent.begin = off[0];
    ent.end = off[1];
    if (ent.begin > ent.end || ent.end > data_size)
      fail(where + ": data range [" + std::to_string(ent.begin) + ", " + std::to_string(ent.end) +
           ") is outside the data section of " + std::to_string(data_size) + " bytes (truncated file?)");
    const int size = dtype_size(ent.dtype);
    if (size == 0) fail(where + ": unknown dtype \"" + ent.dtype + "\"");
    // The element count must fit the data section before it is multiplied out.
    uint64_t elements = 1;
    for (auto d : ent.shape) {
      if (d < 0) fail(where + ": negative dimension");
      if (d != 0 && elements > data_size / uint64_t(d)) fail(where + ": shape " + shape_str(ent.shape) + " is too large for the file");
      elements *= uint64_t(d);
    }
    if (elements * uint64_t(size) != ent.end - ent.begin)
      fail(where + ": byte range of " + std::to_string(ent.end - ent.begin) + " bytes does not match " + ent.dtype +
           " " + shape_str(ent.shape));
    ranges.push_back({{ent.begin, ent.end}, it.key()});
    entries_[it.key()] = ent;
  }
  // The tensors tile the data section: sorted by offset, each starts where the previous ended.
  std::sort(ranges.begin(), ranges.end());
  uint64_t next = 0;
  for (const auto& [r, name] : ranges) {
    if (r.first != next)
      fail(path + ": tensor \"" + name + "\" starts at byte " + std::to_string(r.first) + " of the data, expected " +
           std::to_string(next) + (r.first < next ? " (overlaps the previous tensor)" : " (a gap before it)"));
    next = r.second;
  }
  if (next != data_size)
    fail(path + ": " + std::to_string(data_size - next) + " bytes after the last tensor belong to no tensor");
  const auto file_ck = metadata_.find(kFileChecksum);
  if (file_ck != metadata_.end()) {
    const size_t at = checksum_value_at(header_text);
    if (at == std::string::npos || header_text.compare(at, kZeros.size(), file_ck->second) != 0)
      fail(path + ": malformed " + kFileChecksum);
    std::string zeroed = bytes_;
    zeroed.replace(8 + at, kZeros.size(), kZeros);
    const std::string actual = hex64(checksum64(zeroed.data(), zeroed.size()));
    if (actual != file_ck->second)
      fail(path + ": checksum mismatch (file is corrupt or was truncated): expected " + file_ck->second + ", got " +
           actual);
  } else if (require_checksum) {
    fail(path + ": no " + kFileChecksum + " (not written by this version of loco, or its header is corrupt)");
  } else if (auto ck = metadata_.find("loco.checksum"); ck != metadata_.end()) {
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
const std::string& SafetensorsReader::dtype(const std::string& name) const { return entry(name).dtype; }

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
