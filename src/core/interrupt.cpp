#include "core/interrupt.h"

#include <atomic>

namespace loco {

namespace {
std::atomic<bool (*)()> g_check{nullptr};
}  // namespace

void set_interrupt_check(bool (*check)()) { g_check.store(check); }

bool interrupted() {
  bool (*check)() = g_check.load();
  return check != nullptr && check();
}

}  // namespace loco
