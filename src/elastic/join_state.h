#pragma once
// The state a joiner receives from a live member (elastic/session.h) and its bytes on the wire:
// a JSON header (steps, data position, the next round's members, sizes, the screening history),
// the tensors' floats, then a CRC-32C of everything before it. The bytes come from a peer: every
// size and value is checked before use.
#include <cstdint>
#include <string>
#include <vector>

#include "algo/sync_group.h"

namespace loco {

// What a joiner receives from a live member.
struct JoinState {
  int64_t step = 0, data_epoch = 0, data_offset = 0, optimizer_steps = 0;
  std::vector<int64_t> epoch;  // the members from the next round on
  OuterState outer;          // the method's
  std::vector<float> m, v;  // AdamW moments
  std::string inner;  // a foreign model's inner optimizer state (ForeignWorker), else empty
  // Partial updates: the slice whose inner optimizer state this is (-1: the sender's own, without
  // slices); has_optimizer false when no member of the round trains the joiner's slice (no m, v
  // or inner: the joiner keeps its own).
  int slice = -1;
  bool has_optimizer = true;
};

std::string encode_join_state(const JoinState& s);
// Fails ("the state received from a peer is corrupt ...") unless `bytes` hold a state for a model
// of n_params parameters, n_trainable inner-optimizer entries (none without has_optimizer) and
// n_histories screening histories.
JoinState decode_join_state(const std::string& bytes, size_t n_params, size_t n_trainable, size_t n_histories);

}  // namespace loco
