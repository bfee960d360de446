// The demo model (examples/demo.yaml) trained through the CLI on real text, Debian's fortunes: what
// the curve and resume tests share. The text comes from the Debian package (`make deps` installs
// it; prepared into shards by the test) or from the shards a device run carries in runs/demo-data.
#pragma once
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "skip_or_fail.h"
#include "test_util.h"

namespace ingot::test {

// Quoted for the shell: paths may hold spaces.
inline std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The "loss" of every line of metrics.jsonl (one line a step with logging_steps: 1).
inline std::vector<double> losses(const std::string& metrics_path) {
  std::ifstream f(metrics_path);
  std::vector<double> out;
  std::string line;
  while (std::getline(f, line)) {
    const size_t at = line.find("\"loss\":");
    if (at != std::string::npos) out.push_back(std::stod(line.substr(at + 7)));
  }
  return out;
}

// Token shards of the fortunes text under root (prepared there, or the carried ones). Empty, with
// *skip_reason set, when there is no text; empty with *error set when `ingot prepare` failed.
inline std::string demo_shards(const std::string& root, std::string* skip_reason, std::string* error) {
  namespace fs = std::filesystem;
  const std::string corpus = "/usr/share/games/fortunes", carried = source_dir() + "/runs/demo-data";
  if (!fs::exists(corpus)) {
    if (fs::exists(carried + "/meta.json")) return carried;
    *skip_reason = "no fortunes text: install the `fortunes` package (make deps)";
    return "";
  }
  const std::string data = root + "/data";
  std::string output;
  const int rc = run_command(shell_quoted(binary_path()) + " prepare " + shell_quoted(corpus) +
                                 " --doc-separator % -o " + shell_quoted(data), &output);
  if (rc != 0) {
    *error = "ingot prepare failed (exit " + std::to_string(rc) + "):\n" + output;
    return "";
  }
  return data;
}

// `ingot train examples/demo.yaml` on the shards, into dir, one metrics line a step, no evaluation;
// options: further " --set key=value" (or --resume) arguments. Returns the exit status; the command
// and its output are printed when it fails.
inline int train_demo(const std::string& data, const std::string& dir, const std::string& options,
                      std::string* output) {
  const std::string command = shell_quoted(binary_path()) + " train " +
                              shell_quoted(source_dir() + "/examples/demo.yaml") + " --set train_data=" +
                              shell_quoted(data) + " --set output_dir=" + shell_quoted(dir) +
                              " --set logging_steps=1 --set eval_steps=0" + options;
  const int rc = run_command(command, output);
  if (rc != 0) std::printf("%s\nexit %d:\n%s\n", command.c_str(), rc, output->c_str());
  return rc;
}

}  // namespace ingot::test
