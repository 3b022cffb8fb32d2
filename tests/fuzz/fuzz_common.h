#pragma once
// Shared by the libFuzzer targets: a parser of outside input may reject its input only with a
// loco::Error (the one-line error users see); any other exception, crash, leak, undefined
// behaviour or hang is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "model/config.h"

// A model small enough to run thousands of times a second.
inline loco::ModelConfig fuzz_model(int layers) {
  loco::ModelConfig c;
  c.vocab_size = 16;
  c.hidden_size = 8;
  c.num_layers = layers;
  c.num_heads = 2;
  c.intermediate_size = 8;
  c.max_seq_len = 4;
  return c;
}

#define LOCO_FUZZ_TARGET(...)                                                         \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {            \
    const std::string input(reinterpret_cast<const char*>(data), size);                \
    try {                                                                              \
      __VA_ARGS__                                                                      \
    } catch (const loco::Error&) {                                                     \
    }                                                                                  \
    return 0;                                                                          \
  }
