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

#include "comm/communicator.h"
#include "model/layout.h"

namespace loco {

class CountVectorAverage {
 public:
  // slices = 1: everything is shared, a plain all-reduce.
  CountVectorAverage(const ParamLayout& layout, int slices, const std::string& strategy, int rank, int replicas);

  struct Op {
    std::vector<Range> shared, own;           // parts of the region (sorted)
    std::vector<float> shared_values;         // reduced in place
    std::vector<float> own_values;            // this node's slice, averaged within its group
    std::vector<std::string> gathered;        // every slice's average, from this node's column
    Communicator::Handle shared_handle, group_handle, gather_handle;
  };
  // Starts averaging params over `region` (sorted, merged ranges). `op` must stay in place
  // until finish: the communication thread writes into it.
  void start(Communicator& comm, const float* params, const std::vector<Range>& region, Op& op) const;
  // Waits, then writes the averages over the region, packed in range order, to avg.
  void finish(Communicator& comm, Op& op, const std::vector<Range>& region, std::vector<float>& avg) const;
  // The average of the whole of params, written over them (what start and finish over the
  // whole model compute, without the packed copies: with one slice, one all-reduce in place).
  void average_in_place(Communicator& comm, std::vector<float>& params) const;

 private:
  int slices_, rank_;
  std::vector<std::vector<Range>> slice_ranges_;  // per slice n
  std::vector<Range> all_sliced_;
  std::vector<int> group_, column_;  // ranks training this node's slice; this node's column
};

}  // namespace loco
