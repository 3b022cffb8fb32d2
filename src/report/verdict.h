#pragma once
// The first section of `loco report`, in words: which run is best at equal training tokens and
// at equal wall time, by how much, and whether the budget is long enough to rank methods.
#include <optional>
#include <string>
#include <vector>

#include "run/regime.h"
#include "report/run_data.h"

namespace loco::report {

// Tokens per parameter below which a ranking of methods is not to be trusted: the papers
// compared methods at about 20 (compute-optimal budgets), and short runs favour whatever learns
// fastest at first. The threshold `loco train` warns at (run/regime.h).
constexpr double kRankableTokensPerParam = kParityTokensPerParam;

// The model's parameter count from a run summary (the stages of replica 0), if it has one.
std::optional<double> model_params(const nlohmann::json& summary);

// One line warning that runs of `tokens_per_param` are too short to rank methods, or "" when
// they are long enough.
std::string short_budget_warning(double tokens_per_param);

// The section as HTML (id "verdict"); runs without metrics records are left out of the ranking.
std::string verdict_section(const std::vector<Run>& runs);

}  // namespace loco::report
