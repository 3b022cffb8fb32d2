#include "algo/methods.h"

#include "core/error.h"

namespace loco {

namespace {
const std::vector<std::string> kNames = {"ddp", "diloco", "streaming", "noloco"};  // MethodId's order
}  // namespace

const std::vector<std::string>& method_names() { return kNames; }

const std::string& method_name(MethodId m) { return kNames[size_t(m)]; }

std::optional<MethodId> find_method(const std::string& name) {
  for (size_t i = 0; i < kNames.size(); ++i)
    if (kNames[i] == name) return MethodId(i);
  return std::nullopt;
}

MethodId method_id(const std::string& name) {
  if (auto m = find_method(name)) return *m;
  std::string known;
  for (const auto& n : kNames) known += (known.empty() ? "" : ", ") + n;
  fail("unknown algorithm \"" + name + "\" (" + known + ")");
}

}  // namespace loco
