#include "report/verdict.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "report/svg_chart.h"

namespace loco::report {

namespace {

using nlohmann::json;

// A run's loss at x = budget on one axis (tokens or time): exact at a record, interpolated
// linearly between the two records around it, or not available (budget before the first).
struct AtBudget {
  const Run* run;
  double loss = NAN;
  bool available = false, interpolated = false;
};

std::vector<std::pair<double, double>> curve(const Run& r, const char* axis, bool val) {
  std::vector<std::pair<double, double>> pts;
  for (const auto& m : r.metrics) {
    const char* key = val ? "val_loss" : "train_loss";
    if (!m.contains(key)) continue;
    pts.push_back({num_or(m, axis, NAN), num_or(m, key, NAN)});  // null (non-finite) loss: NaN
  }
  return pts;
}

AtBudget at(const Run& r, const std::vector<std::pair<double, double>>& pts, double budget) {
  AtBudget a{&r};
  for (size_t i = 0; i < pts.size(); ++i) {
    const auto [x, y] = pts[i];
    if (!(x >= budget * (1 - 1e-9))) continue;
    if (std::fabs(x - budget) <= budget * 1e-9) {
      a.loss = y, a.available = true;
    } else if (i > 0) {
      const auto [x0, y0] = pts[i - 1];
      a.loss = y0 + (y - y0) * (budget - x0) / (x - x0), a.available = true, a.interpolated = true;
    }
    break;
  }
  return a;
}

std::string pct(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%+.2f%%", v);
  return b;
}

std::string name_html(const Run& r) { return "<b>" + escape_html(r.name) + "</b>"; }

// "At equal tokens (1.2M, where the shortest run ends): best X at val loss 2.5419; Y +1.20% ..."
std::string ranking(const std::vector<const Run*>& runs, const char* axis, bool val, const std::string& what) {
  std::vector<std::vector<std::pair<double, double>>> curves;
  double budget = INFINITY;
  for (const Run* r : runs) {
    curves.push_back(curve(*r, axis, val));
    budget = std::min(budget, curves.back().empty() ? -INFINITY : curves.back().back().first);
  }
  if (!(budget > 0) || !std::isfinite(budget)) return "";
  std::vector<AtBudget> got;
  for (size_t i = 0; i < runs.size(); ++i) got.push_back(at(*runs[i], curves[i], budget));
  std::vector<AtBudget> ranked;
  std::vector<std::string> left_out;
  for (const auto& a : got) {
    if (a.available && std::isfinite(a.loss))
      ranked.push_back(a);
    else
      left_out.push_back(escape_html(a.run->name) + (a.available ? " (nan)" : " (no record that early)"));
  }
  std::sort(ranked.begin(), ranked.end(), [](const AtBudget& a, const AtBudget& b) { return a.loss < b.loss; });
  const std::string budget_text =
      std::string(axis) == "tokens" ? short_number(budget) + " training tokens" : fixed(budget, 1) + " s of wall time";
  std::string o = "<li data-axis=\"" + std::string(axis) + "\"><b>" + what + "</b> (" + budget_text +
                  ", where the shortest run ends): ";
  if (ranked.empty()) return o + "no run has a finite " + (val ? "validation" : "training") + " loss there.</li>\n";
  const std::string loss_name = val ? "val loss " : "train loss ";
  o += "best is <span class=\"best\" data-run=\"" + escape_html(ranked[0].run->name) + "\">" + name_html(*ranked[0].run) +
       "</span> at " + loss_name + fixed(ranked[0].loss, 4);
  for (size_t i = 1; i < ranked.size(); ++i)
    o += std::string(i == 1 ? "; then " : ", ") + name_html(*ranked[i].run) + " " +
         pct(100 * (ranked[i].loss / ranked[0].loss - 1)) + " (" + fixed(ranked[i].loss, 4) + ")";
  o += ".";
  if (!left_out.empty()) {
    o += " Not ranked: ";
    for (size_t i = 0; i < left_out.size(); ++i) o += (i ? ", " : "") + left_out[i];
    o += ".";
  }
  if (std::any_of(got.begin(), got.end(), [](const AtBudget& a) { return a.interpolated; }))
    o += " (Losses of runs without a record exactly there are interpolated linearly between their two nearest.)";
  return o + "</li>\n";
}

}  // namespace

std::optional<double> model_params(const json& summary) {
  if (!summary.is_object() || !summary.contains("workers") || !summary["workers"].is_array()) return std::nullopt;
  double params = 0;
  for (const auto& w : summary["workers"])
    if (num_or(w, "replica", 0) == 0) params += num_or(w, "param_bytes", 0) / 4;
  if (params > 0) return params;
  return std::nullopt;
}

std::string short_budget_warning(double tokens_per_param) {
  if (!(tokens_per_param < kRankableTokensPerParam)) return "";
  char b[320];
  std::snprintf(b, sizeof b,
                "these runs trained at most %.2g tokens per parameter, far fewer than the ~20 at which the papers "
                "compared methods: too short to rank methods (a ranking this early need not hold at a longer budget)",
                tokens_per_param);
  return b;
}

std::string verdict_section(const std::vector<Run>& runs) {
  std::vector<const Run*> with;
  for (const auto& r : runs)
    if (!r.metrics.empty()) with.push_back(&r);
  std::string o = "<h2>Summary</h2>\n<div id=\"verdict\">\n";
  if (with.empty()) return o + "<p>No run has metrics records yet.</p>\n</div>\n";
  // Validation loss when every run has been evaluated, else the training loss (mean since the
  // previous record) for all.
  const bool val = std::all_of(with.begin(), with.end(), [](const Run* r) { return !curve(*r, "tokens", true).empty(); });
  if (with.size() == 1) {
    const Run& r = *with[0];
    const auto c = curve(r, "tokens", val);
    o += "<p>One run: " + name_html(r) + " reached " + (val ? "val loss " : "train loss ") +
         (c.empty() ? std::string("-") : fixed(c.back().second, 4)) + " after " +
         short_number(num_or(r.metrics.back(), "tokens", NAN)) + " training tokens in " +
         fixed(num_or(r.metrics.back(), "time", NAN), 1) + " s.</p>\n";
  } else {
    o += "<ul>\n" + ranking(with, "tokens", val, "At equal tokens") + ranking(with, "time", val, "At equal wall time") +
         "</ul>\n";
    if (!val) o += "<p class=\"note\">Ranked by training loss: not every run has a validation evaluation.</p>\n";
  }
  double most = 0;
  bool known = false;
  for (const Run* r : with)
    if (const auto p = model_params(r->summary)) {
      most = std::max(most, num_or(r->metrics.back(), "tokens", 0) / *p);
      known = true;
    }
  if (known) {
    const std::string w = short_budget_warning(most);
    if (!w.empty()) o += "<p class=\"warning\" id=\"budget-warning\">Warning: " + escape_html(w) + ".</p>\n";
  }
  return o + "</div>\n";
}

}  // namespace loco::report
