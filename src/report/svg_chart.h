#pragma once
// Line charts as inline SVG for `loco report`: axes with round tick values, one path per series,
// optional point markers with hover titles. Each series' elements carry its run's name
// (data-run) so the report's script can show or hide a run everywhere at once.
#include <string>
#include <utility>
#include <vector>

namespace loco::report {

struct ChartSeries {
  std::string label;     // shown on hover
  std::string run;       // data-run attribute
  std::string classes;   // CSS classes of the path, e.g. "loss-curve train"
  int color = 0;         // index into the palette
  bool markers = false;  // a circle at every point (sparse series, e.g. validation loss)
  bool dashed = false;
  std::vector<std::pair<double, double>> points;
  // Optional, one per point: a non-empty note draws that point hollow with the note in its title.
  std::vector<std::string> notes = {};
};

struct Chart {
  std::string id, title, x_label, y_label;
  bool log_x = false;
  std::vector<ChartSeries> series;
  bool y_from_zero = false;  // the y axis starts at 0 (shares, counts), not at the lowest point
};

// The palette's colour `i` (cycled), as a CSS colour.
std::string palette(int i);
// Text with &, <, >, " and ' escaped for HTML and SVG.
std::string escape_html(const std::string& s);
// A number for a label: 3 significant digits, k/M/G/T suffixes from 10^4 up.
std::string short_number(double v);
// v with `digits` decimals; "-" when it is not finite.
std::string fixed(double v, int digits);
// "Nice" tick values covering [lo, hi]: about `target` of them, steps 1, 2 or 5 x 10^k.
std::vector<double> nice_ticks(double lo, double hi, int target);

// The chart as an <svg> element of the given size; series without finite points are skipped,
// and a chart without any says so instead of drawing empty axes.
std::string render_chart(const Chart& chart, int width = 720, int height = 360);

}  // namespace loco::report
