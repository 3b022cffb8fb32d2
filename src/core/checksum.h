#pragma once
// Checksums for detecting corrupted bytes (not cryptographic hashes): CRC-32C (Castagnoli), as
// TFRecord framing and the elastic rounds' logs use it, and a fast 64-bit FNV-1a variant for
// torn or corrupted files (safetensors' "loco.file_checksum").
#include <cstddef>
#include <cstdint>

namespace loco {

uint32_t crc32c(const void* data, size_t size);
// 64-bit FNV-1a over 8-byte little-endian words (tail bytes folded one by one).
uint64_t checksum64(const void* data, size_t size);

}  // namespace loco
