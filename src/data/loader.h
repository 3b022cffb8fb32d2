#pragma once
// Batches of training windows for one replica. Window w of a token stream is
// tokens[w*S .. w*S+S] (S inputs and their S next-token targets). Each epoch visits the windows
// in a seeded permutation; replica r of M takes permutation entries r, r+M, r+2M, ..., so the
// replicas' streams are disjoint within an epoch (the last W mod M windows are left out so
// all replicas see the same number). The position (epoch, windows taken) is part of the
// training state: set_position() resumes exactly where position() was read.
// Elastic runs change the replicas between rounds: assign() makes this loader replica r of M
// from permutation entry `offset` of an epoch on (entries offset + r, offset + r + M, ...;
// the epoch's next ones start again at 0), so that no window is taken twice however
// the membership changes; next_offset() says where the following assignment starts.
#include <cstdint>
#include <memory>
#include <vector>

namespace loco {

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const std::vector<int32_t>> tokens, int seq_len, int batch, int replica, int replicas,
             uint64_t seed);

  // Fills inputs and targets with batch * seq_len tokens each.
  void next(std::vector<int32_t>& inputs, std::vector<int32_t>& targets);

  struct Position {
    int64_t epoch = 0;
    int64_t taken = 0;  // windows this replica has taken in the epoch
    int64_t offset = 0;  // the permutation entry this epoch's rows start at (elastic runs)
    bool operator==(const Position&) const = default;
  };
  Position position() const { return pos_; }
  void set_position(Position p);

  int64_t windows_per_epoch() const { return per_replica_; }  // per replica

  // Replica `replica` of `replicas` from permutation entry `offset` of `epoch` (elastic).
  void assign(int replica, int replicas, int64_t epoch, int64_t offset);
  // Where the rows of every replica of the current assignment end: {epoch, offset} for the
  // next assignment, when all replicas took as many windows as this one.
  Position next_start() const;
  int replica() const { return replica_; }
  int replicas() const { return replicas_; }

 private:
  int64_t next_window();
  void build_permutation(int64_t epoch);
  std::shared_ptr<const std::vector<int32_t>> tokens_;
  int seq_, batch_, replica_, replicas_;
  uint64_t seed_;
  int64_t rows_in_epoch() const { return (windows_ - pos_.offset) / replicas_; }
  int64_t windows_, per_replica_;
  Position pos_;
  int64_t perm_epoch_ = -1;
  std::vector<int64_t> perm_;
};

}  // namespace loco
