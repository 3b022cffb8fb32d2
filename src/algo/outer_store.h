#pragma once
// Outer parameters and outer momentum of Streaming DiLoCo, fragment by fragment. In memory, or
// offloaded to a scratch file (streaming.offload_outer) so that only the fragments being
// synchronized are resident (docs/streaming.md, "Memory": only the fragment being synchronized
// needs its outer state at hand), with the disk as the slower memory.
#include <cstdint>
#include <string>
#include <vector>

#include "model/layout.h"

namespace loco {

class OuterStore {
 public:
  // fragments: each fragment's ranges of the flat parameter buffer (n values in all).
  // file empty: keep everything in memory; else offload to this file (removed on destruction).
  OuterStore(std::vector<std::vector<Range>> fragments, int64_t n, const std::string& file);
  ~OuterStore();
  OuterStore(const OuterStore&) = delete;
  OuterStore& operator=(const OuterStore&) = delete;

  // Fragment j, packed in range order.
  void read(size_t j, std::vector<float>& theta, std::vector<float>& momentum) const;
  void write(size_t j, const std::vector<float>& theta, const std::vector<float>& momentum);
  // The whole model in layout order: the outer parameters (evaluation), or both (checkpoints).
  void read_params(std::vector<float>& theta) const;
  void read_all(std::vector<float>& theta, std::vector<float>& momentum) const;
  void write_all(const std::vector<float>& theta, const std::vector<float>& momentum);

  bool offloaded() const { return fd_ >= 0; }
  // In memory: the outer parameters and momentum in the flat buffer's layout, to read or write
  // in place (nullptr when offloaded). Valid until the store is destroyed; write() and
  // write_all() change what they hold.
  const float* resident_theta() const { return fd_ < 0 ? theta_.data() : nullptr; }
  const float* resident_momentum() const { return fd_ < 0 ? momentum_.data() : nullptr; }
  float* resident_theta() { return fd_ < 0 ? theta_.data() : nullptr; }
  float* resident_momentum() { return fd_ < 0 ? momentum_.data() : nullptr; }
  int64_t resident_bytes() const { return int64_t(theta_.size() + momentum_.size()) * 4; }

 private:
  void read_at(int64_t offset, float* data, int64_t count) const;         // offsets in floats
  void write_at(int64_t offset, const float* data, int64_t count) const;
  std::vector<std::vector<Range>> fragments_;
  int64_t n_;
  std::string file_;
  int fd_ = -1;
  std::vector<float> theta_, momentum_;  // in-memory mode only
};

}  // namespace loco
