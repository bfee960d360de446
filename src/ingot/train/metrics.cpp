#include "ingot/train/metrics.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ingot/core/error.h"
#include "ingot/data/unicode_nfc.h"
#include "ingot/io/json_util.h"

namespace ingot {

namespace fs = std::filesystem;

std::string metrics_record_json(const MetricsRecord& r) {
  nlohmann::ordered_json j;
  j["step"] = r.step;
  j["loss"] = r.loss ? nlohmann::ordered_json(*r.loss) : nlohmann::ordered_json(nullptr);
  j["lr"] = r.lr;
  j["grad_norm"] = r.grad_norm ? nlohmann::ordered_json(*r.grad_norm) : nlohmann::ordered_json(nullptr);
  j["tokens_per_s"] = r.tokens_per_s;
  j["elapsed_s"] = r.elapsed_s;
  if (r.val_loss) j["val_loss"] = *r.val_loss;
  return j.dump();
}

MetricsLog::MetricsLog(const std::string& output_dir, int64_t resume_step) : dir_(output_dir) {
  const fs::path path = fs::path(dir_) / "metrics.jsonl";
  std::error_code ec;
  if (resume_step >= 0 && fs::symlink_status(path, ec).type() != fs::file_type::not_found) {
    // Read whole as a regular file: a FIFO in its place blocked the resume for good, and a link to
    // /dev/zero filled the memory.
    std::istringstream in(io::read_text_file(path.string(), "the run's metrics"));
    std::string line;
    for (int64_t line_number = 1; std::getline(in, line); ++line_number) {
      if (line.empty()) continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("step")) {
        // A crash mid-append tears the last line before its newline: that one is dropped. A whole
        // line that is no record was edited or damaged, and the rewrite would drop it silently.
        if (in.eof()) break;
        fail(path.string(), " line ", line_number, " is not a metrics record: the file was edited or damaged, and "
             "resuming would rewrite it without that line; mend or remove the line, then resume");
      }
      const std::string where = path.string() + " line " + std::to_string(line_number);
      if (!j["step"].is_number_integer()) fail(where, ": \"step\" must be an integer, got ", io::json_brief(j["step"]));
      // A field that is absent or null has no value (loss and grad_norm of a step without targets).
      auto number = [&](const char* key) -> std::optional<double> {
        if (!j.contains(key) || j[key].is_null()) return std::nullopt;
        if (!j[key].is_number()) fail(where, ": \"", key, "\" must be a number or null, got ", io::json_brief(j[key]));
        return j[key].get<double>();
      };
      MetricsRecord r;
      r.step = j["step"].get<int64_t>();
      if (r.step > resume_step) continue;
      r.loss = number("loss");
      r.lr = number("lr").value_or(0.0);
      r.grad_norm = number("grad_norm");
      r.tokens_per_s = number("tokens_per_s").value_or(0.0);
      r.elapsed_s = number("elapsed_s").value_or(0.0);
      r.val_loss = number("val_loss");
      records_.push_back(r);
    }
  }
  // The plot is replaced by a rename at every save: a directory in its place failed the run only
  // after its last save, with every step done.
  const fs::path plot = fs::path(dir_) / "loss.svg";
  if (fs::is_directory(fs::symlink_status(plot, ec)))
    fail("the run's loss plot ", plot.string(), " is a directory; a run writes its loss curve there: move it away");
  rewrite();
}

void MetricsLog::rewrite() const {
  std::string text;
  for (const MetricsRecord& r : records_) text += metrics_record_json(r) + "\n";
  io::write_file_atomically((fs::path(dir_) / "metrics.jsonl").string(), text);
}

void MetricsLog::append(const MetricsRecord& record) {
  // Merge a validation result into the record of the same step when one exists.
  if (!records_.empty() && records_.back().step == record.step) {
    if (record.val_loss) records_.back().val_loss = record.val_loss;
    rewrite();
    return;
  }
  records_.push_back(record);
  std::ofstream out(fs::path(dir_) / "metrics.jsonl", std::ios::app);
  out << metrics_record_json(record) << "\n";
  out.flush();  // the buffered line reaches the file here, so a full disk is caught, not dropped silently
  INGOT_CHECK(out.good(), "cannot append to ", (fs::path(dir_) / "metrics.jsonl").string(), " (disk full?)");
}

void MetricsLog::write_plot() const {
  // The run's folder name: "runs/x/" and "." name it too.
  fs::path name = fs::absolute(dir_).lexically_normal();
  if (name.filename().empty()) name = name.parent_path();
  io::write_file_atomically((fs::path(dir_) / "loss.svg").string(), loss_curve_svg(records_, name.filename().string()));
}

// Text as SVG (XML 1.0) character data: '&', '<' and '>' escaped, bytes that are not UTF-8 as U+FFFD,
// and control characters, which XML forbids, as '?'. The title is the run's folder name, which may
// hold any of them ("lr1e-3&wd0.1"): written raw, the plot did not parse.
static std::string xml_text(std::string_view text) {
  std::string out;
  for (const char c : data::utf8_lossy(text)) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (static_cast<unsigned char>(c) < 0x20) out += '?';
    else out += c;
  }
  return out;
}

std::string loss_curve_svg(const std::vector<MetricsRecord>& records, const std::string& title) {
  const double width = 720, height = 420, left = 64, right = 20, top = 36, bottom = 48;
  double max_step = 1, lo = INFINITY, hi = -INFINITY;
  for (const MetricsRecord& r : records) {
    max_step = std::max(max_step, static_cast<double>(r.step));
    for (const std::optional<double>& v : {r.loss, r.val_loss})
      if (v && std::isfinite(*v)) lo = std::min(lo, *v), hi = std::max(hi, *v);
  }
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (hi - lo < 1e-9) hi = lo + 1;
  const double pad = 0.05 * (hi - lo);
  lo -= pad, hi += pad;
  auto x = [&](double step) { return left + (width - left - right) * step / max_step; };
  auto y = [&](double v) { return top + (height - top - bottom) * (hi - v) / (hi - lo); };

  std::ostringstream svg;
  svg.precision(4);
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << "<text x=\"" << width / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">loss: " << xml_text(title) << "</text>\n";
  for (int i = 0; i <= 5; ++i) {  // horizontal grid with loss ticks
    const double v = lo + (hi - lo) * i / 5.0;
    svg << "<line x1=\"" << left << "\" x2=\"" << width - right << "\" y1=\"" << y(v) << "\" y2=\"" << y(v)
        << "\" stroke=\"#ddd\"/><text x=\"" << left - 6 << "\" y=\"" << y(v) + 4 << "\" text-anchor=\"end\">" << v << "</text>\n";
  }
  for (int i = 0; i <= 5; ++i) {  // step ticks
    const double s = max_step * i / 5.0;
    svg << "<text x=\"" << x(s) << "\" y=\"" << height - bottom + 18 << "\" text-anchor=\"middle\">"
        << static_cast<int64_t>(std::llround(s)) << "</text>\n";
  }
  svg << "<text x=\"" << (left + width - right) / 2 << "\" y=\"" << height - 10 << "\" text-anchor=\"middle\">step</text>\n";
  svg << "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"";
  for (const MetricsRecord& r : records)
    if (r.loss && std::isfinite(*r.loss)) svg << x(static_cast<double>(r.step)) << "," << y(*r.loss) << " ";
  svg << "\"/>\n<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" points=\"";
  for (const MetricsRecord& r : records)
    if (r.val_loss && std::isfinite(*r.val_loss)) svg << x(static_cast<double>(r.step)) << "," << y(*r.val_loss) << " ";
  svg << "\"/>\n";
  for (const MetricsRecord& r : records)
    if (r.val_loss && std::isfinite(*r.val_loss))
      svg << "<circle cx=\"" << x(static_cast<double>(r.step)) << "\" cy=\"" << y(*r.val_loss) << "\" r=\"3\" fill=\"#d62728\"/>\n";
  svg << "<rect x=\"" << width - right - 150 << "\" y=\"" << top + 4 << "\" width=\"140\" height=\"40\" fill=\"white\" stroke=\"#999\"/>\n"
      << "<line x1=\"" << width - right - 140 << "\" x2=\"" << width - right - 116 << "\" y1=\"" << top + 18 << "\" y2=\"" << top + 18
      << "\" stroke=\"#1f77b4\" stroke-width=\"2\"/><text x=\"" << width - right - 110 << "\" y=\"" << top + 22 << "\">train loss</text>\n"
      << "<line x1=\"" << width - right - 140 << "\" x2=\"" << width - right - 116 << "\" y1=\"" << top + 34 << "\" y2=\"" << top + 34
      << "\" stroke=\"#d62728\" stroke-width=\"2\"/><text x=\"" << width - right - 110 << "\" y=\"" << top + 38 << "\">validation loss</text>\n";
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace ingot
