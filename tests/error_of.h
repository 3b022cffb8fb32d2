#pragma once
// The message of the loco::Error that f throws, or "" when it throws none: tests of refusals
// check what the user reads.
#include <functional>
#include <string>

#include "core/error.h"

namespace loco::test {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace loco::test
