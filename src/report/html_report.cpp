#include "report/html_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "comm/stats.h"
#include "core/error.h"
#include "report/run_data.h"
#include "report/svg_chart.h"
#include "report/verdict.h"

namespace loco::report {

namespace {

using nlohmann::json;

std::string cell(const std::string& s) { return "<td>" + escape_html(s) + "</td>"; }
std::string num_cell(const std::string& s) { return "<td class=\"n\">" + escape_html(s) + "</td>"; }

std::string swatch(int color) {
  return "<span class=\"swatch\" style=\"background:" + palette(color) + "\"></span>";
}

// A worker's place, as the tables name it.
std::string worker_name(const json& w) {
  return "worker " + std::to_string(int(num_or(w, "rank", -1))) + " (stage " + std::to_string(int(num_or(w, "stage", 0))) +
         ", replica " + std::to_string(int(num_or(w, "replica", 0))) + ")";
}

std::string runs_table(const std::vector<Run>& runs) {
  std::string o =
      "<table id=\"runs\"><tr><th>run</th><th>method</th><th>replicas x stages</th><th>backend</th><th>network</th>"
      "<th>steps</th>"
      "<th>tokens</th><th>final train loss</th><th>final val loss</th><th>wall s</th><th>mean CU</th>"
      "<th>training bytes sent / worker</th><th>largest sync</th></tr>\n";
  for (const auto& r : runs) {
    const json& s = r.summary;
    const json& last = r.metrics.empty() ? json::object() : r.metrics.back();
    double val = -1;
    for (const auto& m : r.metrics)
      if (m.contains("val_loss")) val = num_or(m, "val_loss", NAN);  // null: a non-finite evaluation
    const RunTotals tot = s.is_null() ? RunTotals{} : run_totals(s);
    const double sent = tot.training_bytes_sent, largest = tot.largest_sync, cu = tot.cu_sum;
    const size_t n = tot.workers;
    const bool done = !s.is_null();
    std::string method = done ? str_or(s, "algorithm", "?") : r.setting("algorithm");
    if (method.empty()) method = "?";
    const std::string backend = r.backend();
    o += "<tr data-run=\"" + escape_html(r.name) + "\"><td>" + swatch(r.color) + escape_html(r.name) + "</td>" +
         cell(method) +
         num_cell(done ? std::to_string(int(num_or(s, "replicas", 1))) + " x " + std::to_string(int(num_or(s, "stages", 1)))
                       : "-") +
         cell(backend.empty() ? "-" : backend) + cell(network_text(r)) + num_cell(std::to_string(int64_t(num_or(last, "step", 0)))) +
         num_cell(short_number(num_or(last, "tokens", 0))) + num_cell(fixed(num_or(last, "train_loss", NAN), 4)) +
         num_cell(std::isnan(val) ? "nan" : val >= 0 ? fixed(val, 4) : "-") + num_cell(fixed(num_or(last, "time", NAN), 1)) +
         num_cell(n ? fixed(100 * cu / double(n), 1) + "%" : "-") + num_cell(n ? short_number(sent / double(n)) + "B" : "-") +
         num_cell(n ? short_number(largest) + "B" : "-") + "</tr>\n";
  }
  o += "</table>\n";
  bool unfinished = false;
  for (const auto& r : runs) unfinished |= r.summary.is_null();
  if (unfinished)
    o += "<p class=\"note\">Runs without summary.json (still running, or stopped before the end of a segment) show "
         "their metrics only.</p>\n";
  return o;
}

std::string loss_charts(const std::vector<Run>& runs) {
  std::string o;
  bool noted = false;
  for (const char* axis : {"tokens", "time"}) {
    Chart c;
    c.id = std::string("loss-vs-") + axis;
    c.title = std::string("Loss against ") + (axis == std::string("tokens") ? "training tokens" : "wall time");
    c.x_label = axis == std::string("tokens") ? "tokens" : "wall time (s)";
    c.y_label = "loss (nats per token)";
    for (const auto& r : runs) {
      ChartSeries train{r.name + " train", r.name, "loss-curve train", r.color, false, false, {}};
      ChartSeries val{r.name + " val", r.name, "loss-curve val", r.color, true, true, {}};
      for (const auto& m : r.metrics) {
        const double x = num_or(m, axis, NAN);
        train.points.push_back({x, num_or(m, "train_loss", NAN)});  // null: a non-finite loss
        if (!m.contains("val_loss")) continue;
        val.points.push_back({x, num_or(m, "val_loss", NAN)});
        val.notes.push_back(str_or(m, "val_note", ""));
        noted |= !val.notes.back().empty();
      }
      c.series.push_back(std::move(train));
      if (!val.points.empty()) c.series.push_back(std::move(val));
    }
    o += render_chart(c);
  }
  return "<div class=\"charts\">" + o + "</div>\n<p class=\"note\">Solid: training loss (mean since the previous "
         "record); dashed with points: validation loss." +
         std::string(noted ? " Hollow points: evaluations with a note (hover for it; for Streaming DiLoCo, outer "
                             "parameters whose fragments were last synchronized at different steps)."
                           : "") +
         "</p>\n";
}

std::string spread_chart(const std::vector<Run>& runs) {
  Chart c{"replica-spread", "Replica spread (NoLoCo)", "tokens", "spread", false, {}};
  bool any = false;
  for (const auto& r : runs) {
    ChartSeries s{r.name + " spread", r.name, "spread-curve", r.color, true, false, {}};
    for (const auto& m : r.metrics)
      if (m.contains("replica_spread")) s.points.push_back({num_or(m, "tokens", NAN), num_or(m, "replica_spread", NAN)});
    any |= !s.points.empty();
    c.series.push_back(std::move(s));
  }
  if (!any) return "";
  return "<h2>Replica spread</h2>\n" + render_chart(c) +
         "<p class=\"note\">The spread of the replicas' slow weights at each evaluation (docs/noloco.md).</p>\n";
}

// Elastic runs: members at each logged step, and who joined or left (from the metrics).
std::string membership_section(const std::vector<Run>& runs) {
  Chart c{"membership", "Members of the elastic run", "step", "members", false, {}};
  std::string rows;
  for (const auto& r : runs) {
    ChartSeries s{r.name + " members", r.name, "members-curve", r.color, true, false, {}};
    for (const auto& m : r.metrics) {
      if (m.contains("members")) s.points.push_back({num_or(m, "step", NAN), num_or(m, "members", NAN)});
      if (!m.contains("membership") || !m["membership"].is_array()) continue;
      for (const auto& e : m["membership"]) {
        const double lost = num_or(e, "tokens_lost", NAN);
        rows += "<tr data-run=\"" + escape_html(r.name) + "\">" + cell(r.name) + num_cell(fixed(num_or(m, "step", NAN), 0)) +
                cell(str_or(e, "event", "?")) + cell(str_or(e, "name", "member " + fixed(num_or(e, "member", NAN), 0))) +
                num_cell(fixed(num_or(e, "round", NAN), 0)) + num_cell(std::isfinite(lost) ? fixed(lost, 0) : "") +
                cell(str_or(e, "why", "")) + "</tr>\n";
      }
    }
    if (!s.points.empty()) c.series.push_back(std::move(s));
  }
  if (c.series.empty()) return "";
  return "<h2>Membership (elastic)</h2>\n" + render_chart(c) +
         "<table id=\"membership-events\"><tr><th>run</th><th>logged at step</th><th>event</th><th>worker</th>"
         "<th>round</th><th>tokens lost</th><th>why</th></tr>\n" +
         rows + "</table>\n<p class=\"note\">Members of the round in effect at each logged step, and the membership "
                "log as this worker saw it (docs/elastic.md).</p>\n";
}

std::string worker_section(const Run& r) {
  const json& workers = r.summary["workers"];
  std::string o = "<h3 data-run=\"" + escape_html(r.name) + "\">" + swatch(r.color) + escape_html(r.name) + "</h3>\n";
  const bool pipeline = num_or(r.summary, "stages", 1) > 1;
  bool have_series = false;
  for (const auto& w : workers) have_series |= w.contains("series") && w["series"].is_array() && !w["series"].empty();
  if (have_series) {
    Chart cu{"cu-" + r.name, "Compute utilization per worker", "wall time (s)", "CU (per logging interval)", false, {}};
    cu.y_from_zero = true;
    Chart bytes{"bytes-" + r.name, "Bytes sent per worker", "wall time (s)", "bytes sent (cumulative)", false, {}};
    Chart bubble{"bubble-" + r.name, "Pipeline bubble share per worker", "wall time (s)", "bubble / interval", false, {}};
    bytes.y_from_zero = bubble.y_from_zero = true;
    int k = 0;
    for (const auto& w : workers) {
      const std::string label = worker_name(w);
      ChartSeries a{label, r.name, "worker-cu", k, false, false, {}}, b{label, r.name, "worker-bytes", k, false, false, {}},
          p{label, r.name, "worker-bubble", k, false, false, {}};
      double total = 0;
      if (w.contains("series") && w["series"].is_array())
        for (const auto& pt : w["series"]) {
          const double t = num_or(pt, "time", NAN);
          total += num_or(pt, "bytes_sent", 0);
          a.points.push_back({t, num_or(pt, "compute_utilization", NAN)});
          b.points.push_back({t, total});
          p.points.push_back({t, num_or(pt, "bubble_s", NAN) / std::max(1e-12, num_or(pt, "interval_s", NAN))});
        }
      cu.series.push_back(std::move(a));
      bytes.series.push_back(std::move(b));
      bubble.series.push_back(std::move(p));
      ++k;
    }
    o += "<div class=\"charts\">" + render_chart(cu, 560, 300) + render_chart(bytes, 560, 300) +
         (pipeline ? render_chart(bubble, 560, 300) : "") + "</div>\n<p class=\"note\">";
    for (size_t i = 0; i < workers.size(); ++i)
      o += "<span class=\"worker-key\">" + swatch(int(i)) + escape_html(worker_name(workers[i])) + "</span> ";
    o += "</p>\n";
  } else {
    o += "<p class=\"note\">This run's summary has no per-worker series (written by loco before they existed).</p>\n";
  }
  o += "<table class=\"workers\"><tr><th>worker</th><th>bytes sent</th><th>bytes received</th><th>compute s</th>"
       "<th>wait s</th><th>bubble s</th><th>CU</th>" +
       std::string(pipeline ? "<th>bubble share</th>" : "") + "</tr>\n";
  for (const auto& w : workers)
    o += "<tr>" + cell(worker_name(w)) + num_cell(short_number(num_or(w, "bytes_sent", 0)) + "B") +
         num_cell(short_number(num_or(w, "bytes_received", 0)) + "B") + num_cell(fixed(num_or(w, "compute_s", NAN), 2)) +
         num_cell(fixed(num_or(w, "comm_wait_s", NAN), 2)) + num_cell(fixed(num_or(w, "bubble_s", NAN), 2)) +
         num_cell(fixed(100 * num_or(w, "compute_utilization", NAN), 1) + "%") +
         (pipeline ? num_cell(fixed(100 * num_or(w, "bubble_share", NAN), 1) + "%") : "") + "</tr>\n";
  o += "</table>\n";

  // Traffic by operation, summed over the workers.
  struct Op {
    double sent = 0, received = 0, messages = 0, largest = 0;
  };
  std::map<std::string, Op> ops;
  for (const auto& w : workers)
    if (w.contains("by_operation") && w["by_operation"].is_object())
      for (const auto& [name, v] : w["by_operation"].items()) {
        auto& op = ops[name];
        op.sent += num_or(v, "bytes_sent", 0);
        op.received += num_or(v, "bytes_received", 0);
        op.messages += num_or(v, "messages_sent", 0);
        op.largest = std::max(op.largest, num_or(v, "largest_instance_bytes_sent", 0));
      }
  o += "<table class=\"traffic\"><tr><th>operation</th><th>bytes sent (all workers)</th><th>bytes received</th>"
       "<th>messages sent</th><th>largest instance (one worker)</th><th>training traffic</th></tr>\n";
  for (const auto& [name, op] : ops)
    o += "<tr>" + cell(name) + num_cell(short_number(op.sent) + "B") + num_cell(short_number(op.received) + "B") +
         num_cell(short_number(op.messages)) + num_cell(short_number(op.largest) + "B") +
         cell(is_training_traffic(name) ? "yes" : "no") + "</tr>\n";
  o += "</table>\n";
  return o;
}

// Which loco, command, host and CPU trained each run (every start and resume).
std::string provenance_section(const std::vector<Run>& runs) {
  std::string rows;
  auto text = [](const json& j, const char* key) {
    if (!j.contains(key)) return std::string("-");
    return j[key].is_string() ? j[key].get<std::string>() : j[key].dump();
  };
  for (const auto& r : runs)
    for (const auto& inv : r.invocations)
      rows += "<tr>" + cell(r.name) + cell(text(inv, "time")) + cell(text(inv, "resume") == "true" ? "resume" : "start") +
              cell(text(inv, "loco")) + cell(text(inv, "host")) + cell(text(inv, "cpu")) + cell(text(inv, "threads")) +
              cell(text(inv, "precision")) + "<td><code>" + escape_html(text(inv, "command")) + "</code></td></tr>\n";
  if (rows.empty()) return "";
  return "<h2>Provenance</h2>\n<table id=\"provenance\"><tr><th>run</th><th>time (UTC)</th><th></th><th>loco</th>"
         "<th>host</th><th>CPU</th><th>threads</th><th>precision</th><th>command</th></tr>\n" +
         rows + "</table>\n";
}

std::string config_section(const std::vector<Run>& runs) {
  std::set<std::string> keys;  // keys that can change what at least one run computes or measures
  for (const auto& r : runs)
    for (const auto& [k, v] : r.config)
      if (key_applies(k, r)) keys.insert(k);
  std::string o = "<h2>Configuration</h2>\n";
  if (runs.size() > 1) {
    std::string rows;
    for (const auto& k : keys) {
      // A run whose method does not use the key shows "(unused)" and does not make a difference.
      auto shown = [&](const Run& r) {
        const auto it = r.config.find(k);
        return it == r.config.end() ? std::string("(not set)") : key_applies(k, r) ? it->second : "(unused)";
      };
      std::set<std::string> values;
      for (const auto& r : runs)
        if (shown(r) != "(unused)") values.insert(shown(r));
      if (values.size() < 2) continue;
      rows += "<tr>" + cell(k);
      for (const auto& r : runs) rows += cell(shown(r));
      rows += "</tr>\n";
    }
    if (rows.empty()) {
      o += "<p>The runs' configs are identical in every key their methods use.</p>\n";
    } else {
      o += "<table id=\"config-diff\"><tr><th>key</th>";
      for (const auto& r : runs) o += "<th>" + swatch(r.color) + escape_html(r.name) + "</th>";
      o += "</tr>\n" + rows + "</table>\n<p class=\"note\">Keys whose values differ among the runs that use them, "
           "as written in each run's config.toml; \"(unused)\": the run's method, backend or layout does not read "
           "the key.</p>\n";
    }
  }
  for (const auto& r : runs)
    o += "<details><summary>" + escape_html(r.name) + ": config.toml</summary><pre>" +
         escape_html(r.config_text.empty() ? "(no config.toml)" : r.config_text) + "</pre></details>\n";
  return o;
}

const char* kStyle = R"(body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}h3{font-size:15px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#f4f4f4}
.swatch{display:inline-block;width:12px;height:12px;margin-right:6px;vertical-align:-1px}
.charts{display:flex;flex-wrap:wrap;gap:12px}svg.chart{background:#fff;font-size:11px}
.chart .grid{stroke:#e5e5e5}.chart .frame{fill:none;stroke:#999}.chart-title{font-weight:600;font-size:13px}
.legend span.run{cursor:pointer;margin-right:16px;user-select:none}.legend span.off{opacity:.35;text-decoration:line-through}
.note{color:#555;font-size:12px}.warning{color:#a40;font-weight:600}pre{background:#f7f7f7;padding:8px;overflow:auto;max-height:400px})";

// Clicking a run in the legend hides or shows its series and rows everywhere on the page.
const char* kScript = R"(
(function () {
  function toggle(el) {
    var run = el.getAttribute('data-toggle');
    var off = el.classList.toggle('off');
    document.querySelectorAll('g.series[data-run]').forEach(function (g) {
      if (g.getAttribute('data-run') === run) g.style.display = off ? 'none' : '';
    });
  }
  document.querySelectorAll('.legend [data-toggle]').forEach(function (el) {
    el.addEventListener('click', function () { toggle(el); });
  });
  document.body.setAttribute('data-ready', '1');
})();)";

}  // namespace

RunTotals run_totals(const json& summary) {
  RunTotals t;
  for (const auto& w : summary.at("workers")) {
    if (w.contains("by_operation") && w["by_operation"].is_object())
      for (const auto& [op, v] : w["by_operation"].items()) {
        if (is_training_traffic(op)) t.training_bytes_sent += num_or(v, "bytes_sent", 0);
        if (is_sync_traffic(op)) t.largest_sync = std::max(t.largest_sync, num_or(v, "largest_instance_bytes_sent", 0));
      }
    t.peak_send = std::max(t.peak_send, num_or(w, "peak_send_bytes_per_s", 0));
    t.cu_sum += num_or(w, "compute_utilization", 0);
    ++t.workers;
  }
  return t;
}

std::string build_html_report(const std::vector<std::string>& run_dirs) {
  check(!run_dirs.empty(), "no run directories given");
  std::vector<Run> runs;
  std::set<std::string> names;
  for (const auto& d : run_dirs) {
    runs.push_back(load_run(d));
    Run& r = runs.back();
    if (!names.insert(r.name).second) r.name = d;  // two runs with one directory name: the paths tell them apart
    names.insert(r.name);
    r.color = int(runs.size() - 1);
  }
  std::string title = "loco report: ";
  for (size_t i = 0; i < runs.size(); ++i) title += (i ? ", " : "") + runs[i].name;
  std::string o = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + escape_html(title) +
                  "</title>\n<style>" + kStyle + "</style></head>\n<body>\n<h1>" + escape_html(title) + "</h1>\n";
  o += "<p class=\"legend\">";
  for (const auto& r : runs)
    o += "<span class=\"run\" data-toggle=\"" + escape_html(r.name) + "\" title=\"" + escape_html(r.dir) +
         " (click to hide or show)\">" + swatch(r.color) + escape_html(r.name) + "</span>";
  o += "</p>\n" + verdict_section(runs) + "<h2>Runs</h2>\n" + runs_table(runs) + "<h2>Loss</h2>\n" + loss_charts(runs) + spread_chart(runs) +
       membership_section(runs);
  o += "<h2>Workers: compute utilization, bytes and traffic by operation</h2>\n<p class=\"note\">CU: compute time / "
       "(interval - evaluation - checkpoint time) over each logging interval; bytes: payload sent (docs/metrics.md)."
       "</p>\n";
  for (const auto& r : runs)
    if (!r.summary.is_null()) o += worker_section(r);
  o += config_section(runs);
  o += provenance_section(runs);
  o += "<script>" + std::string(kScript) + "</script>\n</body></html>\n";
  return o;
}

}  // namespace loco::report
