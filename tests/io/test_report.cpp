// Pieces of `loco report` and the TensorBoard writer that a wrong edit would silently break:
// tick values, labels, escaping, the chart's paths, and CRC-32C against its published check value.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/checksum.h"
#include "core/error.h"
#include "../error_of.h"
#include "core/fs.h"
#include "io/metrics.h"
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

// Metrics files are read back by report, compare, plot and a resumed run: a record that is not
// one loco writes is refused naming the line, never a raw JSON type error or a wrapped number.
namespace {
std::string metrics_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name + ".jsonl";
  write_file_atomic(path, text);
  return path;
}
std::string refusal(const std::string& text) {
  return test::error_of([&] { read_metric_records(metrics_file("bad", text)); });
}
}  // namespace

TEST(Metrics, RecordsAreCheckedAndNullLossesKept) {
  const auto ok = read_metric_records(metrics_file(
      "ok", "{\"step\":10,\"tokens\":640,\"train_loss\":2.5,\"time\":1.5}\n\n"
            "{\"step\":20,\"tokens\":1280,\"train_loss\":null,\"val_loss\":null}\n"));
  ASSERT_EQ(ok.size(), 2u);
  EXPECT_TRUE(ok[1]["train_loss"].is_null());  // a non-finite loss, as loco.torch writes it
  EXPECT_NE(refusal("5\n").find("bad.jsonl:1: not a JSON object"), std::string::npos);
  EXPECT_NE(refusal("{\"step\":1,\"tokens\":1,\"train_loss\":1}\n{\"tokens\":1,\"train_loss\":1}\n")
                .find("bad.jsonl:2: not a loco metrics record (step missing"),
            std::string::npos);
  for (const char* step : {"1e300", "3.5", "-1", "18446744073709551615", "\"x\""})
    EXPECT_NE(refusal(std::string("{\"step\":") + step + ",\"tokens\":1,\"train_loss\":1}\n").find("not a whole number"),
              std::string::npos)
        << step;
  EXPECT_NE(refusal("{\"step\":1,\"tokens\":\"many\",\"train_loss\":1}\n").find("tokens is \"many\""), std::string::npos);
  EXPECT_NE(refusal("{\"step\":1,\"tokens\":-1,\"train_loss\":1}\n").find("tokens is negative"), std::string::npos);
  EXPECT_NE(refusal("{\"step\":1,\"tokens\":1,\"train_loss\":[]}\n").find("train_loss is []"), std::string::npos);
  EXPECT_NE(refusal("{\"step\":1,\"tokens\":1}\n").find("no train_loss"), std::string::npos);
  EXPECT_NE(refusal("{\"step\":1,\"tokens\":1,\"train_loss\":1,\"time\":null}\n").find("time is null"),
            std::string::npos);
  EXPECT_NE(refusal("{\"step\":1,\"tokens\":1,\"train_loss\":1,\"val_loss\":\"x\"}\n").find("val_loss is"),
            std::string::npos);
}

TEST(Metrics, ResumeKeepsRecordsUpToTheCheckpointAndRefusesCorruptOnes) {
  const std::string path = metrics_file(
      "resume", "{\"step\":10,\"tokens\":1,\"train_loss\":1}\n{\"step\":20,\"tokens\":2,\"train_loss\":null}\n"
                "{\"step\":30,\"tokens\":3,\"train_loss\":1}\n");
  { MetricsLog log(path, 20); }
  const auto kept = read_metric_records(path);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[1]["step"].get<int64_t>(), 20);
  const std::string bad = metrics_file("resume-bad", "{\"step\":\"ten\",\"tokens\":1,\"train_loss\":1}\n");
  try {
    MetricsLog log(bad, 20);
    FAIL() << "a corrupt metrics file was resumed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("resume-bad.jsonl:1: not a loco metrics record"), std::string::npos) << e.what();
  }
}

// A crash or a full disk while appending leaves the last line cut short (the writers append
// whole lines): the run is still read, resumed and appended to, never refused or mixed up.
TEST(Metrics, ALastLineCutShortIsLeftOutAndRemovedByTheNextWrite) {
  const std::string rec10 = "{\"step\":10,\"tokens\":1,\"train_loss\":1}";
  const std::string rec20 = "{\"step\":20,\"tokens\":2,\"train_loss\":1}";
  const std::string torn = "{\"step\":30,\"tok";
  const std::string path = metrics_file("torn", rec10 + "\n" + rec20 + "\n" + torn);
  ASSERT_EQ(read_metric_records(path).size(), 2u);
  ASSERT_EQ(read_metrics(path).size(), 2u);
  // Cut short in the middle of the file is no crash's doing: refused, naming the line.
  EXPECT_NE(refusal(rec10 + "\n" + torn + "\n" + rec20 + "\n").find("bad.jsonl:2: not a JSON object"),
            std::string::npos);
  EXPECT_NE(refusal(torn + "\n").find("bad.jsonl:1: not a JSON object"), std::string::npos);
  // A whole record that lacks only its newline is a record.
  EXPECT_EQ(read_metric_records(metrics_file("whole", rec10 + "\n" + rec20)).size(), 2u);
  // Resumed at step 20: the rewrite leaves no trace of the torn line.
  { MetricsLog log(path, 20); }
  EXPECT_EQ(read_file(path), rec10 + "\n" + rec20 + "\n");
  // append_line (invocations.jsonl) removes a torn tail first, and ends a whole last record.
  const std::string inv = metrics_file("appended", rec10 + "\n" + torn);
  append_line(inv, rec20);
  EXPECT_EQ(read_file(inv), rec10 + "\n" + rec20 + "\n");
  const std::string whole = metrics_file("appended-whole", rec10);
  append_line(whole, rec20);
  EXPECT_EQ(read_file(whole), rec10 + "\n" + rec20 + "\n");
  const std::string only_torn = metrics_file("appended-only-torn", torn);
  append_line(only_torn, rec10);
  EXPECT_EQ(read_file(only_torn), rec10 + "\n");
  const std::string fresh = ::testing::TempDir() + "/appended-new.jsonl";
  std::remove(fresh.c_str());
  append_line(fresh, rec10);
  EXPECT_EQ(read_file(fresh), rec10 + "\n");
}
