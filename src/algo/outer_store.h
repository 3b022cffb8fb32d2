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
  // write(), taking the buffers where it can: in memory, theta and momentum of the fragment's
  // size exactly (capacity too) are swapped with the store's, without a copy. Either way theta
  // and momentum are left with buffers of undefined contents, for the caller to reuse.
  void exchange(size_t j, std::vector<float>& theta, std::vector<float>& momentum);
  // The whole model in layout order: the outer parameters (evaluation), or both (checkpoints).
  void read_params(std::vector<float>& theta) const;
  void read_all(std::vector<float>& theta, std::vector<float>& momentum) const;
  void write_all(const std::vector<float>& theta, const std::vector<float>& momentum);

  bool offloaded() const { return fd_ >= 0; }
  bool resident() const { return fd_ < 0; }
  // In memory: fragment j's outer parameters and momentum, packed, to read or write in place
  // (nullptr when offloaded). Valid until the next write(), exchange() or write_all().
  const float* resident_theta(size_t j) const { return fd_ < 0 ? theta_[j].data() : nullptr; }
  const float* resident_momentum(size_t j) const { return fd_ < 0 ? momentum_[j].data() : nullptr; }
  float* resident_theta(size_t j) { return fd_ < 0 ? theta_[j].data() : nullptr; }
  float* resident_momentum(size_t j) { return fd_ < 0 ? momentum_[j].data() : nullptr; }
  int64_t resident_bytes() const;

 private:
  void read_at(int64_t offset, float* data, int64_t count) const;         // offsets in floats
  void write_at(int64_t offset, const float* data, int64_t count) const;
  std::vector<std::vector<Range>> fragments_;
  int64_t n_;
  std::string file_;
  int fd_ = -1;
  // In memory only: each fragment's, packed (so that a fragment's new state can be swapped in).
  std::vector<std::vector<float>> theta_, momentum_;
};

}  // namespace loco
