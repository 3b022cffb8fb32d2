#pragma once
// Count-vector averaging of partial parameter updates (spec 03-partial.md). Entries every node
// trains are averaged over all M nodes (ring all-reduce); the entries of slice n are averaged
// over the M / N nodes that train it, which send only their own slice (all-gather, summed in
// rank order). Every node ends with the same averages of the whole region.
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
    std::vector<std::string> gathered;        // every node's own-slice values
    Communicator::Handle shared_handle, gather_handle;
  };
  // Starts averaging params over `region` (sorted, merged ranges). `op` must stay in place
  // until finish: the communication thread writes into it.
  void start(Communicator& comm, const float* params, const std::vector<Range>& region, Op& op) const;
  // Waits, then writes the averages over the region, packed in range order, to avg.
  void finish(Communicator& comm, Op& op, const std::vector<Range>& region, std::vector<float>& avg) const;

  int slices() const { return slices_; }

 private:
  int slices_, rank_, replicas_;
  std::vector<std::vector<Range>> slice_ranges_;  // per slice n
  std::vector<Range> all_sliced_;
};

}  // namespace loco
