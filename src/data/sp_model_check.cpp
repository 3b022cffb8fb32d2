#include "data/sp_model_check.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace loco {

namespace {

// Protocol-buffer wire format, only what is needed to find the charsmaps.
struct Reader {
  const std::string& bytes;
  size_t at = 0, end = 0;
  const std::string& source;
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at >= end) fail(source + ": not a SentencePiece model (truncated field)");
      const uint8_t b = uint8_t(bytes[at++]);
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    fail(source + ": not a SentencePiece model (malformed varint)");
  }
  // Calls fn(field, begin, length) for every length-delimited field; skips the others.
  template <class Fn>
  void fields(Fn&& fn) {
    while (at < end) {
      const uint64_t key = varint();
      const uint32_t field = uint32_t(key >> 3), type = uint32_t(key & 7);
      if (type == 0) {
        varint();
      } else if (type == 1 || type == 5) {
        const size_t n = type == 1 ? 8 : 4;
        if (end - at < n) fail(source + ": not a SentencePiece model (truncated field)");
        at += n;
      } else if (type == 2) {
        const uint64_t n = varint();
        if (n > end - at) fail(source + ": not a SentencePiece model (a field runs past the end)");
        fn(field, at, size_t(n));
        at += size_t(n);
      } else {
        fail(source + ": not a SentencePiece model (wire type " + std::to_string(type) + ")");
      }
    }
  }
};

// Darts-clone double-array units, as SentencePiece's normalizer reads them.
bool has_leaf(uint32_t u) { return ((u >> 8) & 1) == 1; }
uint32_t value(uint32_t u) { return u & ((1u << 31) - 1); }
uint32_t label(uint32_t u) { return u & ((1u << 31) | 0xff); }
uint32_t offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

void check_charsmap(const std::string& blob, const std::string& where) {
  if (blob.empty()) return;  // no normalization table (e.g. the identity rule)
  uint32_t trie_size = 0;
  if (blob.size() < 4) fail(where + ": truncated");
  std::memcpy(&trie_size, blob.data(), 4);  // little-endian, as SentencePiece writes it
  if (trie_size % 4 != 0 || trie_size == 0 || trie_size > blob.size() - 4) fail(where + ": malformed trie size");
  const size_t n = trie_size / 4, table = blob.size() - 4 - trie_size;
  std::vector<uint32_t> units(n);
  std::memcpy(units.data(), blob.data() + 4, trie_size);
  if (table == 0 || blob.back() != '\0') fail(where + ": the replacement table is not NUL-terminated");
  // Walk every node a lookup can reach: from a node, the next position is base ^ byte for any
  // input byte, and a node with a leaf reads its value at base.
  std::vector<uint8_t> seen(n, 0);
  std::vector<uint32_t> stack;
  auto enter = [&](uint32_t base) {
    if ((uint64_t(base) | 0xff) >= n) fail(where + ": a trie lookup would leave the trie");
    for (uint32_t c = 0; c < 256; ++c) {
      const uint32_t child = base ^ c;
      if (label(units[child]) == c && !seen[child]) {
        seen[child] = 1;
        stack.push_back(child);
      }
    }
  };
  enter(offset(units[0]));
  while (!stack.empty()) {
    const uint32_t node = stack.back();
    stack.pop_back();
    const uint32_t base = node ^ offset(units[node]);
    if (has_leaf(units[node]) && (base >= n || value(units[base]) >= table))
      fail(where + ": a trie value points outside the replacement table");
    enter(base);
  }
}

}  // namespace

void check_sentencepiece_model(const std::string& model_bytes, const std::string& source) {
  Reader top{model_bytes, 0, model_bytes.size(), source};
  top.fields([&](uint32_t field, size_t begin, size_t length) {
    // ModelProto: 3 normalizer_spec, 5 denormalizer_spec; NormalizerSpec: 2 precompiled_charsmap.
    if (field != 3 && field != 5) return;
    Reader spec{model_bytes, begin, begin + length, source};
    spec.fields([&](uint32_t f, size_t b, size_t len) {
      if (f == 2)
        check_charsmap(model_bytes.substr(b, len),
                       source + ": " + (field == 3 ? "normalizer" : "denormalizer") + " precompiled_charsmap");
    });
  });
}

}  // namespace loco
