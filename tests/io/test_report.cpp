// Pieces of `loco report` and the TensorBoard writer that a wrong edit would silently break:
// tick values, labels, escaping, the chart's paths, and CRC-32C against its published check value.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/checksum.h"
#include "io/tensorboard.h"
#include "report/svg_chart.h"

using namespace loco;
using namespace loco::report;

TEST(Report, NiceTicksCoverTheRangeWithRoundSteps) {
  EXPECT_EQ(nice_ticks(0, 10, 5), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(nice_ticks(1.3, 5.7, 4), (std::vector<double>{2, 3, 4, 5}));
  const auto t = nice_ticks(1234, 98765, 6);
  ASSERT_GE(t.size(), 4u);
  EXPECT_EQ(t[1] - t[0], 20000);
  // A constant series still gets an axis around its value.
  const auto c = nice_ticks(5, 5, 4);
  ASSERT_GE(c.size(), 2u);
  EXPECT_LE(c.front(), 5);
  EXPECT_GE(c.back(), 5);
}

TEST(Report, LabelsAndEscaping) {
  EXPECT_EQ(short_number(2000), "2000");
  EXPECT_EQ(short_number(20480), "20.5k");
  EXPECT_EQ(short_number(3.63e6), "3.63M");
  EXPECT_EQ(short_number(0.025), "0.025");
  EXPECT_EQ(escape_html("<a href=\"x\">'&'</a>"), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
}

TEST(Report, ChartDrawsOnePathPerSeriesWithItsRun) {
  Chart c{"id1", "t", "x", "y", false, {}};
  c.series.push_back({"a train", "a<b", "loss-curve train", 0, false, false, {{0, 3}, {1, 2}, {2, 1}}});
  c.series.push_back({"a val", "a<b", "loss-curve val", 0, true, true, {{2, 1.5}}});
  c.series.push_back({"empty", "z", "loss-curve train", 1, false, false, {{1, NAN}}});
  const std::string svg = render_chart(c);
  auto count = [&](const std::string& needle) {
    size_t n = 0;
    for (size_t p = svg.find(needle); p != std::string::npos; p = svg.find(needle, p + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("<path class=\"loss-curve train\" data-run=\"a&lt;b\""), 1u);
  EXPECT_EQ(count("<path class=\"loss-curve val\""), 1u);
  EXPECT_EQ(count("<circle"), 1u);
  EXPECT_EQ(count("data-run=\"z\""), 0u);  // nothing finite to draw
  EXPECT_NE(svg.find("M64.00 "), std::string::npos);  // the first point at the left edge of the plot
  Chart empty{"id2", "t", "x", "y", false, {}};
  EXPECT_NE(render_chart(empty).find("no data"), std::string::npos);
}

TEST(TensorBoard, Crc32cAndRecordFraming) {
  const char* check = "123456789";
  EXPECT_EQ(crc32c(check, 9), 0xe3069283u);  // the CRC-32C check value
  const std::string r = tf_record("abc");
  ASSERT_EQ(r.size(), 8u + 4u + 3u + 4u);
  uint64_t len = 0;
  std::memcpy(&len, r.data(), 8);
  EXPECT_EQ(len, 3u);
  uint32_t c = 0;
  std::memcpy(&c, r.data() + 8, 4);
  EXPECT_EQ(c, masked_crc32c(r.data(), 8));
  std::memcpy(&c, r.data() + 15, 4);
  EXPECT_EQ(c, masked_crc32c("abc", 3));
  const uint32_t raw = crc32c("abc", 3);
  EXPECT_EQ(masked_crc32c("abc", 3), ((raw >> 15) | (raw << 17)) + 0xa282ead8u);
}
