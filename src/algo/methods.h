#pragma once
// The training methods by name (a run config's `algorithm`): the one place where their names
// are known and compared; the rest of loco asks for a method by its id.
#include <optional>
#include <string>
#include <vector>

namespace loco {

enum class MethodId { Ddp, Diloco, Streaming, Noloco };

// Every method's name, in the order the config's help lists them.
const std::vector<std::string>& method_names();
const std::string& method_name(MethodId m);
// The method named `name`, or nothing (a name read from a file: the caller decides).
std::optional<MethodId> find_method(const std::string& name);
// The method named `name`; fails naming the known ones.
MethodId method_id(const std::string& name);
// Whether the method keeps outer parameters and takes outer steps (all but data-parallel).
inline bool has_outer_step(MethodId m) { return m != MethodId::Ddp; }

}  // namespace loco
