// Training metrics: OUTPUT_DIR/metrics.jsonl (one JSON object per logged step) and the loss-curve
// picture OUTPUT_DIR/loss.svg, both rewritten atomically.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ingot {

struct MetricsRecord {
  int64_t step = 0;
  // None (null in metrics.jsonl): the step had no trained targets, and no update.
  std::optional<double> loss, grad_norm;
  double lr = 0, tokens_per_s = 0, elapsed_s = 0;
  std::optional<double> val_loss;
};

class MetricsLog {
 public:
  // Opens OUTPUT_DIR/metrics.jsonl. With resume_step >= 0, earlier records past resume_step are
  // dropped (they belong to the interrupted tail) and the rest are kept for the plot.
  MetricsLog(const std::string& output_dir, int64_t resume_step);
  void append(const MetricsRecord& record);
  void write_plot() const;   // OUTPUT_DIR/loss.svg
  const std::vector<MetricsRecord>& records() const { return records_; }

 private:
  void rewrite() const;
  std::string dir_;
  std::vector<MetricsRecord> records_;
};

std::string metrics_record_json(const MetricsRecord& r);

// An SVG line chart of train loss (and validation loss points where present) against step.
std::string loss_curve_svg(const std::vector<MetricsRecord>& records, const std::string& title);

}  // namespace ingot
