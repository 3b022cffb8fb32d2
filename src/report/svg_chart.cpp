#include "report/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace loco::report {

namespace {

std::string num(double v) {  // coordinates: two decimals are plenty at screen resolution
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}

}  // namespace

std::string palette(int i) {
  static const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                 "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
  return colors[((i % 10) + 10) % 10];
}

std::string escape_html(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      default: o += c;
    }
  return o;
}

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "-";
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

std::string short_number(double v) {
  if (!std::isfinite(v)) return v != v ? "nan" : (v > 0 ? "inf" : "-inf");
  const double a = std::fabs(v);
  const char* suffix = "";
  double x = v;
  if (a >= 1e12) x = v / 1e12, suffix = "T";
  else if (a >= 1e9) x = v / 1e9, suffix = "G";
  else if (a >= 1e6) x = v / 1e6, suffix = "M";
  else if (a >= 1e4) x = v / 1e3, suffix = "k";
  char b[48];
  std::snprintf(b, sizeof b, *suffix ? "%.3g%s" : "%.4g%s", x, suffix);
  return b;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) {
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.05;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  // The round step whose tick count is closest to the target (the finer one on a tie).
  double step = mag, best = 1e300;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    const double st = m * mag;
    const double count = std::floor(hi / st + 1e-9) - std::ceil(lo / st - 1e-9) + 1;
    if (std::fabs(count - target) < best) best = std::fabs(count - target), step = st;
  }
  std::vector<double> t;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

std::string render_chart(const Chart& c, int width, int height) {
  const double left = 64, right = 16, top = 28, bottom = 44;
  const double pw = width - left - right, ph = height - top - bottom;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  auto tx = [&](double x) { return c.log_x ? std::log10(x) : x; };
  bool any = false;
  for (const auto& s : c.series)
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (c.log_x && x <= 0)) continue;
      x0 = std::min(x0, tx(x)), x1 = std::max(x1, tx(x)), y0 = std::min(y0, y), y1 = std::max(y1, y);
      any = true;
    }
  if (c.y_from_zero) y0 = std::min(y0, 0.0);
  std::string o = "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" id=\"" + escape_html(c.id) +
                  "\" width=\"" + std::to_string(width) + "\" height=\"" + std::to_string(height) + "\" viewBox=\"0 0 " +
                  std::to_string(width) + " " + std::to_string(height) + "\" role=\"img\">\n<title>" +
                  escape_html(c.title) + "</title>\n";
  o += "<text class=\"chart-title\" x=\"" + num(left) + "\" y=\"18\">" + escape_html(c.title) + "</text>\n";
  if (!any) {
    o += "<text class=\"empty\" x=\"" + num(left + pw / 2) + "\" y=\"" + num(top + ph / 2) +
         "\" text-anchor=\"middle\">no data</text>\n</svg>\n";
    return o;
  }
  const auto xt = nice_ticks(x0, x1, 6), yt = nice_ticks(y0, y1, 5);
  x0 = std::min(x0, xt.front()), x1 = std::max(x1, xt.back());
  y0 = std::min(y0, yt.front()), y1 = std::max(y1, yt.back());
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  auto px = [&](double x) { return left + (tx(x) - x0) / (x1 - x0) * pw; };
  auto pxt = [&](double t) { return left + (t - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return top + (1 - (y - y0) / (y1 - y0)) * ph; };
  o += "<g class=\"axes\">\n";
  for (double t : yt)
    o += "<line class=\"grid\" x1=\"" + num(left) + "\" x2=\"" + num(left + pw) + "\" y1=\"" + num(py(t)) +
         "\" y2=\"" + num(py(t)) + "\"/><text x=\"" + num(left - 6) + "\" y=\"" + num(py(t) + 4) +
         "\" text-anchor=\"end\">" + short_number(t) + "</text>\n";
  for (double t : xt)
    o += "<line class=\"grid\" x1=\"" + num(pxt(t)) + "\" x2=\"" + num(pxt(t)) + "\" y1=\"" + num(top) + "\" y2=\"" +
         num(top + ph) + "\"/><text x=\"" + num(pxt(t)) + "\" y=\"" + num(top + ph + 16) +
         "\" text-anchor=\"middle\">" + short_number(c.log_x ? std::pow(10.0, t) : t) + "</text>\n";
  o += "<rect class=\"frame\" x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(pw) + "\" height=\"" +
       num(ph) + "\"/>\n";
  o += "<text class=\"label\" x=\"" + num(left + pw / 2) + "\" y=\"" + num(height - 6) + "\" text-anchor=\"middle\">" +
       escape_html(c.x_label) + "</text>\n";
  o += "<text class=\"label\" transform=\"translate(14," + num(top + ph / 2) + ") rotate(-90)\" text-anchor=\"middle\">" +
       escape_html(c.y_label) + "</text>\n</g>\n";
  for (const auto& s : c.series) {
    std::string d;
    std::string marks;
    for (size_t i = 0; i < s.points.size(); ++i) {
      const auto [x, y] = s.points[i];
      if (!std::isfinite(x) || !std::isfinite(y) || (c.log_x && x <= 0)) continue;
      d += (d.empty() ? "M" : " L") + num(px(x)) + " " + num(py(y));
      const std::string note = i < s.notes.size() ? s.notes[i] : "";
      if (s.markers)
        marks += "<circle cx=\"" + num(px(x)) + "\" cy=\"" + num(py(y)) +
                 (note.empty() ? "\" r=\"3\">" : "\" r=\"4\" class=\"noted\" fill=\"#fff\" stroke=\"" + palette(s.color) + "\">") +
                 "<title>" + escape_html(s.label) + ": " + short_number(y) + " at " + short_number(x) +
                 (note.empty() ? "" : " (" + escape_html(note) + ")") + "</title></circle>";
    }
    if (d.empty()) continue;
    const std::string color = palette(s.color);
    o += "<g class=\"series\" data-run=\"" + escape_html(s.run) + "\">";
    o += "<path class=\"" + escape_html(s.classes) + "\" data-run=\"" + escape_html(s.run) + "\" d=\"" + d +
         "\" fill=\"none\" stroke=\"" + color + "\" stroke-width=\"" + (s.markers ? "2" : "1.4") + "\"" +
         (s.dashed ? " stroke-dasharray=\"5 3\"" : "") + "><title>" + escape_html(s.label) + "</title></path>";
    if (!marks.empty()) o += "<g fill=\"" + color + "\">" + marks + "</g>";
    o += "</g>\n";
  }
  o += "</svg>\n";
  return o;
}

}  // namespace loco::report
