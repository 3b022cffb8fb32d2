#pragma once
// Every user-facing failure is a loco::Error whose message is one line naming the file/field
// and what was expected; the CLI prints it and exits non-zero.
#include <stdexcept>
#include <string>

namespace loco {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

[[noreturn]] inline void fail(const std::string& msg) { throw Error(msg); }

inline void check(bool cond, const std::string& msg) {
  if (!cond) fail(msg);
}

}  // namespace loco
