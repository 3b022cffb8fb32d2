#include "pipeline/schedule.h"

#include <algorithm>

#include "core/error.h"

namespace loco {

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "1f1b") return ScheduleKind::OneFOneB;
  if (name == "gpipe") return ScheduleKind::GPipe;
  fail("pipeline.schedule must be \"1f1b\" or \"gpipe\", got \"" + name + "\"");
}

std::vector<PipeOp> stage_schedule(ScheduleKind kind, int S, int s, int m) {
  check(S >= 1 && s >= 0 && s < S && m >= 1, "internal: bad pipeline schedule arguments");
  std::vector<PipeOp> ops;
  auto F = [&](int i) { ops.push_back({PipeOp::Forward, i}); };
  auto B = [&](int i) { ops.push_back({PipeOp::Backward, i}); };
  if (kind == ScheduleKind::GPipe) {
    for (int i = 0; i < m; ++i) F(i);
    for (int i = 0; i < m; ++i) B(i);
    return ops;
  }
  const int warmup = std::min(S - 1 - s, m);
  for (int i = 0; i < warmup; ++i) F(i);
  for (int i = 0; i + warmup < m; ++i) {
    F(i + warmup);
    B(i);
  }
  for (int i = m - warmup; i < m; ++i) B(i);
  return ops;
}

int max_in_flight(const std::vector<PipeOp>& ops) {
  int now = 0, most = 0;
  for (const auto& op : ops) {
    now += op.kind == PipeOp::Forward ? 1 : -1;
    most = std::max(most, now);
  }
  return most;
}

std::string describe(const std::vector<PipeOp>& ops) {
  std::string out;
  for (const auto& op : ops) {
    if (!out.empty()) out += ' ';
    out += (op.kind == PipeOp::Forward ? 'F' : 'B') + std::to_string(op.microbatch);
  }
  return out;
}

}  // namespace loco
