#pragma once
// In-process backend: the workers are threads of one process, exchanging messages through
// per-(sender, receiver) queues.
#include <memory>
#include <vector>

#include "comm/transport.h"

namespace loco {

class InProcessHub;

// Creates the endpoints of `size` workers sharing one hub (endpoint r is rank r).
std::vector<std::unique_ptr<Transport>> make_inprocess_transports(int size);

}  // namespace loco
