#pragma once
// Count-vector averaging of partial parameter updates (docs/partial.md). Entries every node
// trains are averaged over all M nodes (ring all-reduce). The entries of slice n are averaged
// over the G = M / N nodes that train it: a ring all-reduce within that group (ranks n, n + N,
// ...), and then each "column" of N nodes (ranks iN .. iN + N - 1, one per slice) all-gathers
// its slices' averages. No node sends a slice it does not hold, and every node ends with the
// same averages of the whole region. Bytes per node: 2 (M-1)/M of the shared entries, plus
// 2 (G-1)/G + (N-1) times one slice.
#include <string>
#include <vector>

#include "algo/worker.h"
#include "comm/communicator.h"
#include "model/layout.h"

namespace loco {

class CountVectorAverage {
 public:
  // slices = 1: everything is shared, a plain all-reduce.
  CountVectorAverage(const ParamLayout& layout, int slices, const std::string& strategy, int rank, int replicas);
  // Members that come and go (the elastic backend): this member trains `slice`, and each
  // average first learns the slice of every member of its communicator (one small all-gather).
  // Slice n's entries are averaged over the members that train it (a ring all-reduce among
  // them), and its lowest-ranked trainer sends the average to every member (a ring all-gather of
  // those averages); a slice nobody in the round trains keeps its entries (no member moved
  // them). Bytes per member: 2 (M-1)/M of the shared entries, 2 (G-1)/G of its slice among its
  // G trainers, and about the slices present once.
  static CountVectorAverage among_members(const ParamLayout& layout, int slices, const std::string& strategy,
                                          int slice);

  struct Op {
    std::vector<Range> shared, own;           // parts of the region (sorted)
    std::vector<float> shared_values;         // reduced in place
    std::vector<float> own_values;            // this node's slice, averaged within its group
    std::vector<float> gathered;              // the slices' averages gathered (member order)
    Communicator::Handle shared_handle, group_handle, gather_handle;
    std::vector<int> slice_of;                // among_members: each member's slice
    std::vector<float> kept;                  // among_members: the slices nobody trains, as they are
  };
  // Starts averaging params over `region` (sorted, merged ranges). `op` must stay in place
  // until finish: the communication thread writes into it.
  void start(Communicator& comm, const float* params, const std::vector<Range>& region, Op& op) const;
  // Waits, then writes the averages over the region, packed in range order, to avg.
  void finish(Communicator& comm, Op& op, const std::vector<Range>& region, std::vector<float>& avg) const;
  // The average of the whole of params, written over them (what start and finish over the
  // whole model compute; with one slice, one all-reduce in place). Its buffers are kept from one
  // call to the next (a round's several model-sized buffers would otherwise be allocated and
  // faulted in anew every round).
  void average_in_place(Communicator& comm, std::vector<float>& params) const;

 private:
  CountVectorAverage(const ParamLayout& layout, int slices, const std::string& strategy);
  // among_members: the round's slices (op.slice_of), then the reductions.
  void start_among(Communicator& comm, const float* params, const std::vector<Range>& region, Op& op) const;
  void finish_among(Communicator& comm, Op& op, const std::vector<Range>& region, std::vector<float>& avg) const;

  int slices_, rank_;
  bool among_ = false;  // among_members: rank_ holds this member's slice
  std::vector<std::vector<Range>> slice_ranges_;  // per slice n
  std::vector<Range> all_sliced_;
  std::vector<int> group_, column_;  // ranks training this node's slice; this node's column
  mutable Op kept_op_;               // average_in_place's buffers
};

// A slice named by a peer (4 bytes): the slice, or -1 when it is not one of the N.
int parse_slice(const std::string& bytes, int N);

// The method's count-vector average: over the fixed replicas (rank mod N trains slice n), or,
// when members come and go, among each round's members (their slices learnt in the round).
CountVectorAverage count_vector_average(const RunConfig& cfg, const Worker& w, bool members_change);

}  // namespace loco
