// End-to-end training through the `ingot` CLI on a tiny model: determinism, bit-exact resume,
// export/generate, and the bad-input contract (clear message naming the culprit, non-zero exit,
// no partial output that looks complete).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "ingot/core/dir_lock.h"
#include "ingot/core/error.h"
#include "ingot/core/rng.h"
#include "ingot/data/shard.h"
#include "ingot/io/safetensors.h"
#include "ingot/optim/lr_schedule.h"
#include "ingot/data/bpe_tokenizer.h"
#include "ingot/train/generate.h"
#include "ingot/train/metrics.h"
#include "test_util.h"

namespace fs = std::filesystem;
using ingot::test::read_file;
using ingot::test::run_command;

namespace {

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

std::string cli() { return ingot::test::binary_path(); }

// A small deterministic corpus written by the test itself.
std::string make_corpus(const std::string& dir) {
  const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "then",
                         "runs", "far", "away", "from", "home", "while", "birds", "sing", "songs", "of"};
  std::string text;
  uint64_t state = 12345;
  for (int doc = 0; doc < 60; ++doc) {
    for (int w = 0; w < 40; ++w) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      text += words[(state >> 33) % 20];
      text += w % 9 == 8 ? ".\n" : " ";
    }
    text += "\n%\n";
  }
  fs::create_directories(dir);
  write_file(dir + "/corpus.txt", text);
  return dir + "/corpus.txt";
}

std::string tiny_config(const std::string& data, const std::string& out, int max_steps, int save_steps) {
  std::ostringstream y;
  y << "model_config:\n  model_type: llama\n  vocab_size: 257\n  hidden_size: 32\n  intermediate_size: 48\n"
    << "  num_hidden_layers: 2\n  num_attention_heads: 4\n  num_key_value_heads: 2\n"
    << "  max_position_embeddings: 64\n  tie_word_embeddings: true\n"
    << "train_data: " << data << "\nsequence_len: 16\nmicro_batch_size: 2\ngradient_accumulation_steps: 2\n"
    << "max_steps: " << max_steps << "\nlearning_rate: 1.0e-2\nwarmup_steps: 2\nweight_decay: 0.1\n"
    << "output_dir: " << out << "\nlogging_steps: 1\neval_steps: 3\neval_max_batches: 2\n"
    << "save_steps: " << save_steps << "\nsave_total_limit: 3\nseed: 7\nnum_threads: 2\nval_fraction: 0.1\n";
  return y.str();
}

// Losses of metrics.jsonl with the wall-clock fields dropped.
std::string loss_lines(const std::string& path) {
  std::ifstream f(path);
  std::string line, out;
  while (std::getline(f, line)) {
    const size_t cut = line.find(",\"tokens_per_s\"");
    out += line.substr(0, cut);
    const size_t val = line.find("\"val_loss\"");
    if (val != std::string::npos) out += line.substr(val);
    out += "\n";
  }
  return out;
}

class Training : public ::testing::Test {
 protected:
  void SetUp() override {
    root = ingot::test::temp_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    const std::string corpus = make_corpus(root + "/text");
    data = root + "/data";
    std::string output;
    ASSERT_EQ(0, run_command(cli() + " prepare " + corpus + " --doc-separator % -o " + data, &output)) << output;
  }
  int train(const std::string& config_text, const std::string& name, const std::string& flags, std::string* output) {
    const std::string path = root + "/" + name + ".yaml";
    write_file(path, config_text);
    return run_command(cli() + " train " + path + " " + flags, output);
  }
  // The pid of a process that has exited (a shell that printed it), as text; "" if that failed.
  static std::string exited_pid() {
    std::string out;
    if (run_command("sh -c 'echo $$'", &out) != 0) return "";
    return out.substr(0, out.find_first_not_of("0123456789"));
  }
  // Runs `ingot train CONFIG FLAGS` in the background with its output in log, waits for a line
  // starting with wait_for (up to 60 s), then `pause` seconds, sends SIGTERM once and waits for the
  // exit (up to 60 s, then kills). Returns the exit status.
  int train_and_stop(const std::string& config, const std::string& flags, const std::string& log,
                     const std::string& wait_for, const std::string& pause) {
    write_file(root + "/stop.sh", "\"$1\" train \"$2\" " + flags + " >\"$3\" 2>&1 &\n"
                                  "pid=$!\n"
                                  "for i in $(seq 1200); do grep -q '^" + wait_for + "' \"$3\" && break; sleep 0.05; done\n"
                                  "sleep " + pause + "\n"
                                  "kill -TERM $pid\n"
                                  "for i in $(seq 1200); do kill -0 $pid 2>/dev/null || break; sleep 0.05; done\n"
                                  "kill -KILL $pid 2>/dev/null\n"
                                  "wait $pid\n");
    std::string out;
    return run_command("bash " + root + "/stop.sh " + cli() + " " + config + " " + log, &out);
  }
  // Runs `ingot train CONFIG FLAGS` in the background with its output in log, pauses it (SIGSTOP)
  // once the shell test `until` holds (polled for up to 30 s), runs the shell commands `while_paused`,
  // resumes it, waits for its exit and then runs `after`. Returns the run's exit status.
  int train_paused(const std::string& config, const std::string& flags, const std::string& log,
                   const std::string& until, const std::string& while_paused, const std::string& after = "") {
    write_file(root + "/pause.sh", cli() + " train " + config + " " + flags + " >" + log + " 2>&1 &\n"
                                   "pid=$!\n"
                                   "for i in $(seq 3000); do " + until + " && break; sleep 0.01; done\n"
                                   "kill -STOP $pid\n" + while_paused + "\nkill -CONT $pid\n"
                                   "wait $pid\nrc=$?\n" + after + "\nexit $rc\n");
    std::string out;
    return run_command("bash " + root + "/pause.sh", &out);
  }
  // Prepares jsonl (chat records) with the Llama 3 fixture tokenizer into root/chat-data and returns
  // a tiny config (vocabulary 515) training on it into root/run.
  std::string llama3_chat_config(const std::string& jsonl, int max_steps) {
    write_file(root + "/chats.jsonl", jsonl);
    std::string out;
    EXPECT_EQ(0, run_command(cli() + " prepare " + root + "/chats.jsonl --format chat --tokenizer " +
                                 ingot::test::source_dir() + "/tests/fixtures/chat/llama3_tokenizer/tokenizer.json -o " +
                                 root + "/chat-data --overwrite", &out)) << out;
    std::string config = tiny_config(root + "/chat-data", root + "/run", max_steps, 0);
    config.replace(config.find("vocab_size: 257"), 15, "vocab_size: 515");
    return config;
  }
  void run_chat_sft(const std::string& tokenizer, const std::string& model_type, int vocab);
  std::string root, data;
};

// Writes value(k) over every element k of the F32 tensor `name` in the safetensors file `path`, in
// place (damaged weights or moments for the divergence tests).
void overwrite_f32_tensor(const std::string& path, const std::string& name, const std::function<float(uint64_t)>& value) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header_bytes = 0;
  f.read(reinterpret_cast<char*>(&header_bytes), 8);
  std::string header(header_bytes, '\0');
  f.read(header.data(), static_cast<std::streamsize>(header_bytes));
  const auto entry = nlohmann::json::parse(header).at(name);
  ASSERT_EQ(entry.at("dtype"), "F32") << path << " " << name;
  const uint64_t begin = entry.at("data_offsets")[0].get<uint64_t>(), end = entry.at("data_offsets")[1].get<uint64_t>();
  f.seekp(static_cast<std::streamoff>(8 + header_bytes + begin));
  for (uint64_t k = 0; k < (end - begin) / 4; ++k) {
    const float v = value(k);
    f.write(reinterpret_cast<const char*>(&v), 4);
  }
  ASSERT_TRUE(f.good()) << path;
}

}  // namespace

TEST_F(Training, SameRunTwiceGivesIdenticalBits) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/a", 6, 0), "a", "", &out)) << out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/b", 6, 0), "b", "", &out)) << out;
  const std::string a = loss_lines(root + "/a/metrics.jsonl");
  EXPECT_EQ(6, std::count(a.begin(), a.end(), '\n'));
  EXPECT_EQ(a, loss_lines(root + "/b/metrics.jsonl"));
  EXPECT_EQ(read_file(root + "/a/checkpoint-6/model.safetensors"), read_file(root + "/b/checkpoint-6/model.safetensors"));
  EXPECT_EQ(read_file(root + "/a/checkpoint-6/optimizer.safetensors"),
            read_file(root + "/b/checkpoint-6/optimizer.safetensors"));
  EXPECT_TRUE(fs::exists(root + "/a/loss.svg"));
}

// metrics.jsonl as records, one a line.
std::vector<nlohmann::json> metrics_records(const std::string& path) {
  std::vector<nlohmann::json> records;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) records.push_back(nlohmann::json::parse(line));
  return records;
}

// What the logs report, against values known without the trainer. Weights drawn at init_std 1e-8
// make every logit 0 to within about 1e-12, so any mean of per-target losses is ln(vocab) (to f32's
// rounding of each),
// while a sum, a mean over batches or a divisor one off (64 targets a step, 64 a validation pass)
// is not: the loss at step 1 (lr 0, the warm-up's start) and the val_loss after it (the weights
// unchanged) must be ln(257). And each step's logged lr must be the schedule's at the step before
// it (the update count), built from the config's keys, min_lr_ratio among them.
TEST_F(Training, ReportedLossesAreMeansOverTargetsAndLrFollowsTheSchedule) {
  std::string config = tiny_config(data, root + "/run", 6, 0);
  config += "init_std: 1.0e-8\nlr_scheduler_type: cosine\nmin_lr_ratio: 0.1\n";
  std::string out;
  ASSERT_EQ(0, train(config, "run", "--set eval_steps=1", &out)) << out;
  const std::vector<nlohmann::json> records = metrics_records(root + "/run/metrics.jsonl");
  ASSERT_EQ(records.size(), 6u);
  EXPECT_NEAR(records[0]["loss"].get<double>(), std::log(257.0), 1e-6);  // per-target losses are f32
  EXPECT_NEAR(records[0]["val_loss"].get<double>(), std::log(257.0), 1e-6);
  ingot::LrSchedule schedule;
  schedule.type = "cosine";
  schedule.peak = 1e-2;
  schedule.warmup_steps = 2;
  schedule.total_steps = 6;
  schedule.min_lr_ratio = 0.1;
  for (const nlohmann::json& r : records) {
    const int64_t step = r["step"].get<int64_t>();
    EXPECT_NEAR(r["lr"].get<double>(), schedule.at(step - 1), 1e-15) << "step " << step;
  }
  EXPECT_GT(records[5]["lr"].get<double>(), 1e-3 - 1e-12);  // the floor: 0.1 of the peak, not 0
}

// "activations 38.7 MiB" in a run's memory-plan line, in bytes (-1 when absent).
double planned_activation_bytes(const std::string& log) {
  const size_t at = log.find("activations ");
  if (at == std::string::npos) return -1;
  std::istringstream in(log.substr(at + 12));
  double value = 0;
  std::string unit;
  in >> value >> unit;
  const double scale = unit == "GiB" ? 1024.0 * 1024 * 1024 : unit == "MiB" ? 1024.0 * 1024 : unit == "KiB" ? 1024.0 : 1.0;
  return value * scale;
}

// A sequence_len above the model's max_position_embeddings trains (RoPE reaches any position) with
// a warning naming both values; at or below it, no warning.
TEST_F(Training, SequenceLongerThanTheModelsContextWarns) {
  std::string out;
  std::string config = tiny_config(data, root + "/long", 1, 0);
  ASSERT_EQ(0, train(config, "ok", "", &out)) << out;
  EXPECT_EQ(out.find("max_position_embeddings"), std::string::npos) << out;
  const std::string declared = "max_position_embeddings: 64";
  config.replace(config.find(declared), declared.size(), "max_position_embeddings: 8");
  ASSERT_EQ(0, train(config, "long", "--overwrite", &out)) << out;
  for (const char* needle : {"warning: ", "long.yaml", "sequence_len 16 is above max_position_embeddings 8 (model_config)"})
    EXPECT_NE(out.find(needle), std::string::npos) << needle << "\n" << out;
  // A value from --set is blamed on the flag, not the file. And an output_dir spelled with a
  // trailing slash still titles loss.svg with the run's name (it was "loss: ").
  ASSERT_EQ(0, train(config, "long", "--overwrite --set sequence_len=12 --set output_dir=" + root + "/long/", &out)) << out;
  EXPECT_NE(out.find("warning: --set sequence_len=12: sequence_len 12 is above"), std::string::npos) << out;
  EXPECT_NE(read_file(root + "/long/loss.svg").find(">loss: long</text>"), std::string::npos);
}

// The plot's title is the run's folder name, written as XML character data: a name holding '&' or
// '<' ("lr1e-3&wd0.1"), a control byte or bytes that are not UTF-8 made loss.svg a file no viewer
// parses (a fuzzing review, 2026-12-02).
TEST(LossCurve, TitleIsWrittenAsXmlText) {
  ingot::MetricsRecord record;
  record.step = 1;
  record.loss = 2.5;
  const std::string svg = ingot::loss_curve_svg({record}, "lr1e-3&wd<0.1>\x01\xff");
  EXPECT_NE(svg.find(">loss: lr1e-3&amp;wd&lt;0.1&gt;?\xEF\xBF\xBD</text>"), std::string::npos) << svg;
  EXPECT_EQ(svg.find("&w"), std::string::npos) << svg;
}

TEST_F(Training, ElementwiseRecomputeGivesIdenticalBits) {
  // recompute: elementwise keeps the GEMMs' outputs and recomputes the norms, SwiGLU (and for
  // qwen3, qk-norm and RoPE) into shared buffers during the backward: the same values, so the
  // same bits as keeping everything, with a smaller activation plan. Llama and Qwen3 (qk-norm),
  // three layers so that more than one block is recomputed.
  for (const std::string type : {"llama", "qwen3"}) {
    auto config = [&](const std::string& name) {
      std::string text = tiny_config(data, root + "/" + name, 6, 0);
      text.replace(text.find("num_hidden_layers: 2"), 20, "num_hidden_layers: 3");
      if (type == "qwen3") text.replace(text.find("model_type: llama"), 17, "model_type: qwen3\n  head_dim: 8");
      return text;
    };
    std::string out_none, out_elementwise;
    ASSERT_EQ(0, train(config(type + "-none"), type + "-none", "", &out_none)) << out_none;
    ASSERT_EQ(0, train(config(type + "-elementwise"), type + "-elementwise", "--set recompute=elementwise", &out_elementwise))
        << out_elementwise;
    const std::string none = root + "/" + type + "-none", elementwise = root + "/" + type + "-elementwise";
    ASSERT_TRUE(fs::exists(none + "/checkpoint-6/model.safetensors")) << type;
    ASSERT_TRUE(fs::exists(elementwise + "/checkpoint-6/model.safetensors")) << type;
    EXPECT_EQ(loss_lines(none + "/metrics.jsonl"), loss_lines(elementwise + "/metrics.jsonl")) << type;
    EXPECT_EQ(read_file(none + "/checkpoint-6/model.safetensors"), read_file(elementwise + "/checkpoint-6/model.safetensors"))
        << type;
    EXPECT_EQ(read_file(none + "/checkpoint-6/optimizer.safetensors"),
              read_file(elementwise + "/checkpoint-6/optimizer.safetensors"))
        << type;
    const double kept = planned_activation_bytes(out_none), recomputed = planned_activation_bytes(out_elementwise);
    ASSERT_GT(kept, 0) << out_none;
    EXPECT_LT(recomputed, kept) << type << ": the elementwise plan should hold fewer activations";
  }
}

TEST_F(Training, BlockRecomputeGivesIdenticalBits) {
  // recompute: block re-runs each block's forward in the backward with the same ops in the same
  // order, so everything must match the run that kept its activations, bit for bit; and its
  // activation plan must be smaller.
  std::string out_none, out_block;
  ASSERT_EQ(0, train(tiny_config(data, root + "/none", 6, 0), "none", "", &out_none)) << out_none;
  ASSERT_EQ(0, train(tiny_config(data, root + "/block", 6, 0), "block", "--set recompute=block", &out_block))
      << out_block;
  EXPECT_EQ(loss_lines(root + "/none/metrics.jsonl"), loss_lines(root + "/block/metrics.jsonl"));
  EXPECT_EQ(read_file(root + "/none/checkpoint-6/model.safetensors"),
            read_file(root + "/block/checkpoint-6/model.safetensors"));
  EXPECT_EQ(read_file(root + "/none/checkpoint-6/optimizer.safetensors"),
            read_file(root + "/block/checkpoint-6/optimizer.safetensors"));
  auto activations = [](const std::string& log) {
    const size_t at = log.find("activations ");
    return at == std::string::npos ? std::string() : log.substr(at, log.find(" |", at) - at);
  };
  ASSERT_FALSE(activations(out_none).empty()) << out_none;
  EXPECT_NE(activations(out_none), activations(out_block)) << "the block plan should hold fewer activations";

  std::string out;
  EXPECT_NE(0, train(tiny_config(data, root + "/bad", 2, 0), "bad", "--set recompute=layer", &out));
  EXPECT_NE(out.find("elementwise"), std::string::npos) << "the error should list the choices: " << out;
  EXPECT_NE(out.find("recompute"), std::string::npos) << out;
  EXPECT_NE(out.find("layer"), std::string::npos) << out;
}

TEST_F(Training, RunThatCannotFitFailsBeforeAllocating) {
  // Llama-3-8B at 64 x 65536 tokens (bench) and 2^26 tokens a micro-batch of the tiny model (train) need terabytes:
  // both commands must refuse with the plan before the first allocation, rather than crash in one.
  std::string out;
  EXPECT_NE(0, run_command(cli() + " bench --model llama-3-8b --device cpu --seq 65536 --micro-batch 64", &out));
  EXPECT_NE(out.find("the run needs"), std::string::npos) << out;
  EXPECT_NE(out.find("is available on cpu"), std::string::npos) << out;
  EXPECT_NE(out.find("activations"), std::string::npos) << out;
  EXPECT_EQ(out.find("--no-master-weights"), std::string::npos) << "a bf16-recipe remedy offered on the CPU:\n" << out;
  EXPECT_NE(0, train(tiny_config(data, root + "/huge", 2, 0), "huge",
                     "--set micro_batch_size=1048576 --set sequence_len=64", &out));
  EXPECT_NE(out.find("the run needs"), std::string::npos) << out;
  EXPECT_NE(out.find("recompute: elementwise"), std::string::npos) << out;
  EXPECT_EQ(out.find("master_weights: false"), std::string::npos) << "a bf16-recipe remedy offered on the CPU:\n" << out;
  EXPECT_FALSE(fs::exists(root + "/huge/metrics.jsonl"));

  // A model whose weights, gradients and moments alone (about 280 TB) fit no machine: no smaller
  // batch helps, and the advice must not send the user after one.
  std::string giant = tiny_config(data, root + "/giant", 2, 0);
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"hidden_size: 32", "hidden_size: 16384"},
                                 {"intermediate_size: 48", "intermediate_size: 65536"},
                                 {"num_hidden_layers: 2", "num_hidden_layers: 4096"},
                                 {"num_attention_heads: 4", "num_attention_heads: 128"},
                                 {"num_key_value_heads: 2", "num_key_value_heads: 8"}}) {
    ASSERT_NE(giant.find(from), std::string::npos) << from;
    giant.replace(giant.find(from), from.size(), to);
  }
  EXPECT_NE(0, train(giant, "giant", "", &out));
  EXPECT_NE(out.find("the weights, gradients and optimizer state alone take"), std::string::npos) << out;
  EXPECT_NE(out.find("no smaller batch fits: a smaller model"), std::string::npos) << out;
  EXPECT_EQ(out.find("micro_batch_size"), std::string::npos) << "a batch remedy for the model's own state:\n" << out;
  EXPECT_FALSE(fs::exists(root + "/giant/metrics.jsonl"));
}

TEST_F(Training, BenchRefusesBf16FlagsOnTheCpuNamingTheDevice) {
  std::string out;
  EXPECT_EQ(2, run_command(cli() + " bench --model qwen2.5-0.5b --device cpu --seq 16 --micro-batch 1 --grad-dtype bf16", &out));
  EXPECT_NE(out.find("--grad-dtype"), std::string::npos) << out;
  EXPECT_NE(out.find("--device cuda"), std::string::npos) << out;
  // --no-master-weights too (it was silently ignored on the CPU).
  EXPECT_EQ(2, run_command(cli() + " bench --model qwen2.5-0.5b --device cpu --seq 16 --micro-batch 1 --no-master-weights", &out));
  EXPECT_NE(out.find("--no-master-weights belong to the bf16 recipe"), std::string::npos) << out;
  // --no-cuda-graph too (it was silently ignored on the CPU).
  EXPECT_EQ(2, run_command(cli() + " bench --model qwen2.5-0.5b --device cpu --seq 16 --micro-batch 1 --no-cuda-graph", &out));
  EXPECT_NE(out.find("--no-cuda-graph turns off the CUDA graph replay"), std::string::npos) << out;
}

// A --model path that is missing or a file was taken for a preset name ("unknown bench model"),
// which never said what was wrong with the path. A name with no '/' that names nothing is a preset.
TEST_F(Training, BenchNamesWhatIsWrongWithAModelPath) {
  std::string out;
  const std::string bench = " --device cpu --seq 16 --micro-batch 1 --steps 1 --warmup 0";
  EXPECT_EQ(1, run_command(cli() + " bench --model " + root + "/nowhere" + bench, &out));
  EXPECT_NE(out.find("error: no such model or checkpoint: " + root + "/nowhere\n"), std::string::npos) << out;
  write_file(root + "/config.json", "{}");
  EXPECT_EQ(1, run_command(cli() + " bench --model " + root + "/config.json" + bench, &out));
  EXPECT_NE(out.find("error: " + root + "/config.json is a file; give the directory that holds config.json"),
            std::string::npos) << out;
  // A file named like a preset (as a shell redirect creates one) does not hide the preset: this run
  // gets as far as the CPU's refusal of --no-cuda-graph, after the model is read.
  write_file(root + "/qwen2.5-0.5b", "");
  EXPECT_EQ(2, run_command("cd " + root + " && " + cli() + " bench --model qwen2.5-0.5b --no-cuda-graph" + bench, &out));
  EXPECT_NE(out.find("--no-cuda-graph turns off the CUDA graph replay"), std::string::npos) << out;
  EXPECT_EQ(1, run_command(cli() + " bench --model llama-3.2-1B" + bench, &out));
  EXPECT_NE(out.find("error: unknown bench model \"llama-3.2-1B\": give a model, checkpoint or run directory, or one "
                     "of llama-3.2-1b,"), std::string::npos) << out;
}

// A device that cannot be had names where it was asked for: the --set, else the config file (the
// error named neither). Only where there is no CUDA device to take, as in CI.
TEST_F(Training, AnUnavailableDeviceNamesWhereItWasAsked) {
  std::string out;
  const std::string config = tiny_config(data, root + "/run", 1, 0);
  if (train(config, "by_flag", "--set device=cuda", &out) == 0) GTEST_SKIP() << "this machine has a CUDA device";
  EXPECT_NE(out.find("error: --set device=cuda: device: cuda was requested but"), std::string::npos) << out;
  EXPECT_NE(0, train(config + "device: cuda\n", "in_file", "", &out));
  EXPECT_NE(out.find("error: " + root + "/in_file.yaml: device: cuda was requested but"), std::string::npos) << out;
}

// bench --packed-doc-len feeds packed rows (segment ids, positions restarting per document) and
// counts attention FLOPs over the pairs that attend: fewer than whole causal rows.
TEST_F(Training, BenchPacksRowsWhenAsked) {
  fs::create_directories(root + "/tiny");
  write_file(root + "/tiny/config.json",
             R"({"model_type": "llama", "vocab_size": 257, "hidden_size": 32, "intermediate_size": 48,
                 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "max_position_embeddings": 32})");
  const std::string bench = cli() + " bench --model " + root + "/tiny --device cpu --seq 64 --micro-batch 2 --steps 2 --warmup 0";
  auto flops_of = [](const std::string& out) {
    const size_t at = out.find("\"flops_per_token\":");
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 18));
  };
  std::string whole, packed, text, out;
  ASSERT_EQ(0, run_command(bench + " --json", &whole)) << whole;
  ASSERT_EQ(0, run_command(bench + " --json --packed-doc-len 8", &packed)) << packed;
  EXPECT_NE(packed.find("\"packed_doc_len\":8"), std::string::npos) << packed;
  EXPECT_GT(flops_of(packed), 0) << packed;
  EXPECT_LT(flops_of(packed), flops_of(whole)) << whole << packed;
  ASSERT_EQ(0, run_command(bench + " --packed-doc-len 8", &text)) << text;
  EXPECT_NE(text.find("packed rows: document lengths drawn with mean 8"), std::string::npos) << text;
  // MFU is against the H100/H200 bf16 peak: not printed for a CPU run (0.01% before), null in JSON.
  EXPECT_EQ(text.find("MFU"), std::string::npos) << text;
  EXPECT_NE(whole.find("\"mfu\":null"), std::string::npos) << whole;
  // --seq 64 is past the config's 32 positions: timed all the same, with a warning (as `ingot train` gives).
  EXPECT_NE(text.find("warning: --seq 64 is above max_position_embeddings 32 of " + root + "/tiny"), std::string::npos)
      << text;
  // --json prints one JSON line on standard output, whatever else is said: that warning and
  // --profile's breakdown go to standard error (they came first on standard output).
  std::string json_only;
  ASSERT_EQ(0, run_command("(" + bench + " --json --profile 2>" + root + "/bench.err)", &json_only)) << json_only;
  EXPECT_EQ(std::count(json_only.begin(), json_only.end(), '\n'), 1) << json_only;
  EXPECT_TRUE(json_only.starts_with("{") && json_only.ends_with("}\n")) << json_only;
  EXPECT_NE(json_only.find("\"system\":\"ingot\""), std::string::npos) << json_only;
  const std::string err = read_file(root + "/bench.err");
  EXPECT_NE(err.find("warning: --seq 64 is above"), std::string::npos) << err;
  EXPECT_NE(err.find("step breakdown"), std::string::npos) << err;
  // A run's output_dir, as generate, info and export take it (its newest checkpoint's config).
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 1, 0), "run", "", &out)) << out;
  EXPECT_EQ(0, run_command(cli() + " bench --model " + root + "/run --device cpu --seq 16 --micro-batch 1 --steps 1 --warmup 0",
                           &out)) << out;
  EXPECT_NE(out.find("tokens/s"), std::string::npos) << out;
  EXPECT_EQ(2, run_command(bench + " --packed-doc-len 65", &out));
  EXPECT_NE(out.find("--packed-doc-len must lie in [1, --seq 64]"), std::string::npos) << out;
}

// A run killed while saving leaves checkpoint-<step>.tmp-<pid> behind: the next run in that
// output_dir removes it (its process is gone) and says so; a live process's folder stays.
// Under the output_dir lock every partial checkpoint is stale, even one named after a pid that is
// alive now (pids are reused, and no other run can be writing there).
TEST_F(Training, RemovesPartialCheckpointsOfKilledRuns) {
  std::string out;
  const std::string dead_pid = exited_pid();
  ASSERT_FALSE(dead_pid.empty());
  const std::string dir = root + "/partial", dead = dir + "/checkpoint-2.tmp-" + dead_pid;
  const std::string reused = dir + "/checkpoint-1.tmp-" + std::to_string(::getpid());
  fs::create_directories(dead);
  write_file(dead + "/model.safetensors", "half a checkpoint");
  fs::create_directories(reused);
  // Folders that only look like one are the user's, and stay: one holding a folder (save writes
  // files only; a review found such a folder deleted), one whose step is not a number.
  const std::string holds_folder = dir + "/checkpoint-1.tmp-" + dead_pid, not_a_step = dir + "/checkpoint-x.tmp-" + dead_pid;
  fs::create_directories(holds_folder + "/data");
  write_file(holds_folder + "/data/notes.txt", "mine");
  fs::create_directories(not_a_step);
  ASSERT_EQ(0, train(tiny_config(data, dir, 2, 0), "partial", "", &out)) << out;
  for (const std::string& partial : {dead, reused}) {
    EXPECT_FALSE(fs::exists(partial)) << out;
    EXPECT_NE(out.find("note: removed " + partial + ", a partial checkpoint of a run killed while saving"),
              std::string::npos) << out;
  }
  EXPECT_TRUE(fs::exists(dir + "/checkpoint-2/model.safetensors"));
  EXPECT_TRUE(fs::exists(holds_folder + "/data/notes.txt")) << out;
  EXPECT_TRUE(fs::exists(not_a_step)) << out;
}

// A file under a checkpoint's name in output_dir is no checkpoint: a new run deleted it at the
// save of that step, and --resume passed over it to an older checkpoint (then deleted it too).
// Both now stop before step 1, naming it, and leave it as it was.
TEST_F(Training, AFileUnderACheckpointsNameIsRefusedAndKept) {
  std::string out;
  fs::create_directories(root + "/o");
  write_file(root + "/o/checkpoint-2", "precious");
  EXPECT_NE(0, train(tiny_config(data, root + "/o", 2, 0), "o", "", &out));
  EXPECT_NE(out.find("output_dir " + root + "/o holds checkpoint-2, which is not a checkpoint folder; move it out of "
                     "output_dir"), std::string::npos) << out;
  EXPECT_EQ(read_file(root + "/o/checkpoint-2"), "precious");
  ASSERT_EQ(0, train(tiny_config(data, root + "/r", 2, 0), "r", "--set save_steps=1", &out)) << out;
  write_file(root + "/r/checkpoint-3", "precious");
  EXPECT_NE(0, train(tiny_config(data, root + "/r", 3, 0), "r", "--resume", &out));
  EXPECT_NE(out.find("holds checkpoint-3, which is not a checkpoint folder"), std::string::npos) << out;
  EXPECT_EQ(read_file(root + "/r/checkpoint-3"), "precious");
  EXPECT_NE(0, train(tiny_config(data, root + "/r", 3, 0), "r", "--overwrite", &out));
  EXPECT_EQ(read_file(root + "/r/checkpoint-3"), "precious");
  EXPECT_TRUE(fs::exists(root + "/r/checkpoint-2/model.safetensors"));
  // A link to itself: --resume printed a raw "Too many levels of symbolic links".
  fs::remove(root + "/r/checkpoint-3");
  fs::create_symlink("checkpoint-3", root + "/r/checkpoint-3");
  EXPECT_NE(0, train(tiny_config(data, root + "/r", 3, 0), "r", "--resume", &out));
  EXPECT_NE(out.find("holds checkpoint-3, which is not a checkpoint folder"), std::string::npos) << out;
  EXPECT_TRUE(fs::is_symlink(root + "/r/checkpoint-3"));
}

// A killed prepare leaves its .prepare-<pid> folder: partial shards (removed by the next prepare
// into that directory, which says so) or, killed while swapping datasets, the old dataset in old/
// (kept and named). A prepare whose pid matches such a folder's builds in another.
TEST_F(Training, PrepareTidiesAfterKilledPrepares) {
  std::string out;
  const std::string dead_pid = exited_pid();
  ASSERT_FALSE(dead_pid.empty());
  const std::string partial = data + "/.prepare-" + dead_pid, swapping = data + "/.prepare-" + dead_pid + "-2";
  fs::create_directories(partial);
  write_file(partial + "/train-00000.bin", "half a shard");
  fs::create_directories(swapping + "/old");
  write_file(swapping + "/old/meta.json", "the dataset set aside");
  const std::string corpus = root + "/text/corpus.txt";
  ASSERT_EQ(0, run_command(cli() + " prepare " + corpus + " --doc-separator % -o " + data + " --overwrite", &out)) << out;
  EXPECT_FALSE(fs::exists(partial)) << out;
  EXPECT_NE(out.find("note: removed " + partial + ", the partial output of a killed prepare"), std::string::npos) << out;
  // Named at the start; once this --overwrite has replaced the folder's dataset, kept as superseded/.
  EXPECT_EQ(read_file(swapping + "/superseded/meta.json"), "the dataset set aside");
  EXPECT_NE(out.find("note: " + swapping + "/old holds a dataset that an `ingot prepare --overwrite`, since killed"),
            std::string::npos) << out;

  write_file(root + "/same_pid.sh", "mkdir -p \"$3/.prepare-$$/old\" && echo kept >\"$3/.prepare-$$/old/meta.json\" && "
                                    "exec \"$1\" prepare \"$2\" --doc-separator % -o \"$3\" --overwrite\n");
  ASSERT_EQ(0, run_command("bash " + root + "/same_pid.sh " + cli() + " " + corpus + " " + data, &out)) << out;
  int kept = 0;
  for (const auto& entry : fs::directory_iterator(data)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".prepare-", 0) == 0 && entry.path() != swapping) {  // the pid reused: not superseded
      EXPECT_EQ(read_file((entry.path() / "old/meta.json").string()), "kept\n") << entry.path();
      ++kept;
    }
  }
  EXPECT_EQ(kept, 1) << "the folder named after the reused pid, with its set-aside dataset, must be kept";
  EXPECT_TRUE(fs::exists(data + "/meta.json"));
}

// A shard truncated in place while training reads it (shards are memory-mapped) raised SIGBUS and
// ended the process with no word; now the error names the file, and the exit status is 1.
TEST_F(Training, ShardTruncatedDuringTrainingIsANamedError) {
  std::string out;
  write_file(root + "/truncated.yaml", tiny_config(data, root + "/truncated", 1000000, 0));
  const std::string log = root + "/truncated.log", shard = data + "/train-00000.bin";
  write_file(root + "/truncate.sh", "\"$1\" train \"$2\" --set eval_steps=0 >\"$3\" 2>&1 &\n"
                                    "pid=$!\n"
                                    "for i in $(seq 1200); do grep -q '^step 3/' \"$3\" && break; sleep 0.05; done\n"
                                    ": >\"$4\"\n"
                                    "for i in $(seq 1200); do kill -0 $pid 2>/dev/null || break; sleep 0.05; done\n"
                                    "kill -KILL $pid 2>/dev/null\n"
                                    "wait $pid\n");
  const int rc = run_command("bash " + root + "/truncate.sh " + cli() + " " + root + "/truncated.yaml " + log + " " + shard, &out);
  const std::string text = read_file(log);
  EXPECT_EQ(rc, 1) << out << text;  // 135 was SIGBUS
  EXPECT_NE(text.find("error: " + shard + " changed on disk while ingot was reading it (truncated or overwritten in place"),
            std::string::npos) << text;
}

// Two runs on one output_dir would interleave their checkpoints and metrics: the second is refused
// while the first holds the directory's lock, and the lock goes with its holder.
TEST_F(Training, SecondRunOnABusyOutputDirIsRefused) {
  std::string out;
  const std::string dir = root + "/busy";
  {
    const ingot::DirectoryLock held(dir);  // stands for a run in progress: this process
    ASSERT_TRUE(held.held()) << held.warning();
    EXPECT_NE(0, train(tiny_config(data, dir, 2, 0), "busy", "", &out));
    EXPECT_NE(out.find("output_dir " + dir + " is in use by another ingot run (pid " + std::to_string(::getpid()) + ")"),
              std::string::npos) << out;
    EXPECT_FALSE(fs::exists(dir + "/metrics.jsonl")) << out;
  }
  ASSERT_EQ(0, train(tiny_config(data, dir, 2, 0), "busy", "", &out)) << out;
  EXPECT_TRUE(fs::exists(dir + "/checkpoint-2"));
  // Nor does `export --overwrite` replace a directory a run is writing.
  ASSERT_EQ(0, train(tiny_config(data, root + "/other", 2, 0), "other", "", &out)) << out;
  const ingot::DirectoryLock held(dir);
  EXPECT_NE(0, run_command(cli() + " export " + root + "/other " + dir + " --overwrite", &out));
  EXPECT_NE(out.find("export: " + dir + " is the output_dir of an ingot run in progress"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(dir + "/checkpoint-2/model.safetensors"));
}

// SIGTERM (a scheduler's preemption, `kill`) ends a run after the step in hand with a checkpoint,
// and exit status 143; --resume then finishes it with the bits of an uninterrupted run. Here it
// stops an --overwrite run before its first save of its own: the run it replaces is kept aside.
TEST_F(Training, StopSignalSavesACheckpointToResumeFrom) {
  std::string out;
  const std::string dir = root + "/stopped";
  constexpr int kSteps = 2000;  // ~2 s on two cores; the signal comes at step 3 and a few more
  ASSERT_EQ(0, train(tiny_config(data, dir, 2, 0), "stopped", "", &out)) << out;
  write_file(root + "/stopped.yaml", tiny_config(data, dir, kSteps, 0));
  const std::string log = root + "/stopped.log";
  const int rc = train_and_stop(root + "/stopped.yaml", "--overwrite --set eval_steps=0", log, "step 3/", "0");
  const std::string text = read_file(log);
  EXPECT_EQ(rc, 128 + 15) << text;
  EXPECT_NE(text.find("ingot: SIGTERM: stopping after the step in hand (and saving a checkpoint); a second signal stops at once"),
            std::string::npos) << "the signal is acknowledged when it comes\n" << text;
  const size_t at = text.find("stopped by SIGTERM after step ");
  ASSERT_NE(at, std::string::npos) << text;
  const int64_t step = std::stoll(text.substr(at + 30));
  EXPECT_GE(step, 3) << text;
  ASSERT_LT(step, kSteps) << text;
  const std::string ckpt = dir + "/checkpoint-" + std::to_string(step), total = std::to_string(kSteps);
  EXPECT_NE(text.find("of " + total + ": saved " + ckpt + "; --resume continues from it"), std::string::npos) << text;
  EXPECT_EQ(nlohmann::json::parse(read_file(ckpt + "/trainer_state.json")).at("step"), step);
  EXPECT_NE(text.find("step " + std::to_string(step) + "/" + total + " | loss"), std::string::npos)
      << "the last step is logged\n" << text;
  EXPECT_FALSE(fs::exists(dir + "/checkpoint-2"));
  const size_t kept_at = text.find("note: the run --overwrite replaces is kept in " + dir + "/.replaced-run-");
  ASSERT_NE(kept_at, std::string::npos) << text;
  const std::string aside = text.substr(kept_at + 46, text.find(' ', kept_at + 46) - kept_at - 46);
  EXPECT_TRUE(fs::exists(aside + "/checkpoint-2/model.safetensors")) << aside;

  ASSERT_EQ(0, train(tiny_config(data, dir, kSteps, 0), "stopped", "--resume --set eval_steps=0", &out)) << out;
  EXPECT_NE(out.find("resumed from " + ckpt + " at step " + std::to_string(step)), std::string::npos) << out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/straight", kSteps, 0), "straight", "--set eval_steps=0", &out)) << out;
  const std::string last = "/checkpoint-" + total;
  EXPECT_EQ(loss_lines(root + "/straight/metrics.jsonl"), loss_lines(dir + "/metrics.jsonl"));
  EXPECT_EQ(read_file(root + "/straight" + last + "/model.safetensors"), read_file(dir + last + "/model.safetensors"));
  EXPECT_EQ(read_file(root + "/straight" + last + "/optimizer.safetensors"), read_file(dir + last + "/optimizer.safetensors"));
}

// A stop during the last step's evaluation: training is complete and saved, the evaluation cut
// short. The run says that step has no val_loss and ends by the signal; it used to end with status
// 0 and the val_loss silently missing (and --resume had nothing left to do).
TEST_F(Training, StopDuringTheLastEvaluationIsNamed) {
  std::string out;
  const std::string text = read_file(root + "/text/corpus.txt");
  std::string repeated;
  for (int i = 0; i < 200; ++i) repeated += text;
  fs::create_directories(root + "/big");
  write_file(root + "/big/corpus.txt", repeated);
  ASSERT_EQ(0, run_command(cli() + " prepare " + root + "/big/corpus.txt --doc-separator % -o " + root + "/bigdata", &out))
      << out;
  // Every validation window of 90% of 2.4M tokens: seconds of evaluation after a step of
  // milliseconds. The signal comes half a second after step 1 is logged: during step 2's evaluation.
  // (Sent at once, it could land before step 2 began on a loaded machine, which rightly stops
  // after step 1.)
  write_file(root + "/last.yaml", tiny_config(root + "/bigdata", root + "/run", 2, 0));
  const std::string log = root + "/last.log";
  const std::string flags = "--set eval_max_batches=0 --set val_fraction=0.9 --set eval_steps=2";
  const int rc = train_and_stop(root + "/last.yaml", flags, log, "step 1/2", "0.5");
  const std::string logged = read_file(log);
  EXPECT_EQ(rc, 128 + 15) << logged;
  EXPECT_NE(logged.find("step 2/2 | loss"), std::string::npos) << logged;
  EXPECT_NE(logged.find(" | no val_loss: SIGTERM came before the evaluation ended\n"), std::string::npos) << logged;
  EXPECT_NE(logged.find("stopped by SIGTERM before the last step's evaluation ended (step 2): training is complete and "
                        "saved, but step 2 has no val_loss"),
            std::string::npos) << logged;
  EXPECT_TRUE(fs::exists(root + "/run/checkpoint-2/model.safetensors")) << logged;
  ASSERT_EQ(0, run_command(cli() + " train " + root + "/last.yaml --resume " + flags, &out)) << out;
  EXPECT_NE(out.find("nothing to do: the run already reached max_steps 2"), std::string::npos) << out;
}

// A run killed before its first step (a second Ctrl-C) leaves an empty metrics.jsonl: the next run
// in that folder starts without --overwrite, where it used to be refused as "already holds a run".
TEST_F(Training, EmptyMetricsOfARunKilledBeforeStepOneIsNoRun) {
  std::string out;
  fs::create_directories(root + "/run");
  write_file(root + "/run/metrics.jsonl", "");
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 1, 0), "run", "--set eval_steps=0", &out)) << out;
  EXPECT_TRUE(fs::exists(root + "/run/checkpoint-1"));
  // One record is a run: refused as before.
  fs::remove_all(root + "/other");
  fs::create_directories(root + "/other");
  write_file(root + "/other/metrics.jsonl", "{\"step\": 1, \"loss\": 5.0}\n");
  EXPECT_NE(0, train(tiny_config(data, root + "/other", 1, 0), "other", "--set eval_steps=0", &out));
  EXPECT_NE(out.find("already holds a run (metrics.jsonl"), std::string::npos) << out;
}

// An --overwrite run killed outright leaves the old run in .replaced-run-<pid>: later runs in that
// output_dir say where it is, and keep it, also when --overwrite runs under that same pid again
// (pids are reused; `exec` keeps the shell's pid here). It used to clear the folder for itself.
TEST_F(Training, NamesAReplacedRunLeftByAKilledOverwrite) {
  std::string out;
  const std::string dead_pid = exited_pid();
  ASSERT_FALSE(dead_pid.empty());
  const std::string dir = root + "/orphan", aside = dir + "/.replaced-run-" + dead_pid;
  fs::create_directories(aside);
  write_file(aside + "/metrics.jsonl", "{\"step\": 1, \"loss\": 5.0}\n");
  ASSERT_EQ(0, train(tiny_config(data, dir, 2, 0), "orphan", "", &out)) << out;
  EXPECT_NE(out.find("note: " + aside + " holds a run that an `--overwrite` run, killed or stopped before its first checkpoint, had moved aside"),
            std::string::npos) << out;
  EXPECT_TRUE(fs::exists(aside + "/metrics.jsonl")) << "the old run must be kept";

  write_file(root + "/same_pid.sh", "mkdir \"$3/.replaced-run-$$\" && echo oldest >\"$3/.replaced-run-$$/metrics.jsonl\" && "
                                    "exec \"$1\" train \"$2\" --overwrite\n");
  ASSERT_EQ(0, run_command("bash " + root + "/same_pid.sh " + cli() + " " + root + "/orphan.yaml " + dir, &out)) << out;
  EXPECT_TRUE(fs::exists(dir + "/checkpoint-2"));
  int kept = 0;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().rfind(".replaced-run-", 0) == 0 && entry.path() != aside) {
      EXPECT_EQ(read_file((entry.path() / "metrics.jsonl").string()), "oldest\n") << entry.path();
      EXPECT_NE(out.find("note: " + entry.path().string() + " holds a run"), std::string::npos) << out;
      ++kept;
    }
  EXPECT_EQ(kept, 1) << "the set-aside run named after the reused pid must be kept";
}

// A step whose batches hold no trained target (all masked, as in the middle of a long SFT prompt)
// has no loss and no update. It used to log loss 0.0, and AdamW's weight decay and momentum moved
// the weights anyway.
// A dataset folder of 40 documents of 12 tokens where only every fifth has targets (its second
// half): with padded rows and one row a step, most steps have none.
void write_sparse_target_data(const std::string& dir) {
  ingot::data::ShardData shard;
  shard.vocab_size = 257;
  for (int doc = 0; doc < 40; ++doc) {
    shard.document_starts.push_back(shard.tokens.size());
    for (int t = 0; t < 12; ++t) {
      shard.tokens.push_back(97 + (doc * 7 + t * 3) % 26);
      shard.loss_mask.push_back(doc % 5 == 0 && t >= 6 ? 1 : 0);
    }
  }
  fs::create_directories(dir);
  ingot::data::write_shard(dir + "/train-00000.bin", shard);
}

TEST_F(Training, StepWithNoTrainedTargetsLeavesTheWeights) {
  std::string out;
  write_sparse_target_data(root + "/masked");
  const std::string dir = root + "/sparse";
  ASSERT_EQ(0, train(tiny_config(root + "/masked", dir, 12, 1), "sparse",
                     "--set packing=padded --set micro_batch_size=1 --set gradient_accumulation_steps=1 "
                     "--set save_total_limit=20 --set eval_steps=0", &out)) << out;
  std::vector<int64_t> skipped;
  bool trained = false;
  for (const nlohmann::json& j : metrics_records(dir + "/metrics.jsonl")) {
    const std::string line = j.dump();
    const int64_t step = j.at("step").get<int64_t>();
    if (j.at("loss").is_null()) {
      EXPECT_TRUE(j.at("grad_norm").is_null()) << line;
      EXPECT_NE(out.find("step " + std::to_string(step) + "/12 | no trained targets in its batches (all masked or padding): no update"),
                std::string::npos) << out;
      skipped.push_back(step);
    } else {
      EXPECT_GT(j.at("loss").get<double>(), 0.0) << line;
      trained = true;
    }
  }
  EXPECT_TRUE(trained) << out;
  const auto later = std::find_if(skipped.begin(), skipped.end(), [](int64_t step) { return step >= 2; });
  ASSERT_NE(later, skipped.end()) << "no step after the first was without targets; change the data\n" << out;
  // Learning rate and weight decay are nonzero at that step, so any update would show.
  const std::string before = dir + "/checkpoint-" + std::to_string(*later - 1), after = dir + "/checkpoint-" + std::to_string(*later);
  EXPECT_EQ(read_file(before + "/model.safetensors"), read_file(after + "/model.safetensors")) << *later;
  EXPECT_EQ(read_file(before + "/optimizer.safetensors"), read_file(after + "/optimizer.safetensors")) << *later;
  EXPECT_NE(out.find("final loss"), std::string::npos) << out;
  // A run whose last step had no targets gives its final loss with the step it is of.
  int64_t last_trained = *later - 1;
  while (last_trained > 0 && std::find(skipped.begin(), skipped.end(), last_trained) != skipped.end()) --last_trained;
  ASSERT_GT(last_trained, 0) << "no trained step before step " << *later << "; change the data";
  ASSERT_EQ(0, train(tiny_config(root + "/masked", root + "/short", *later, 0), "short",
                     "--set packing=padded --set micro_batch_size=1 --set gradient_accumulation_steps=1 --set eval_steps=0", &out)) << out;
  const size_t done = out.find("done: step " + std::to_string(*later) + " of " + std::to_string(*later) + ", final loss ");
  ASSERT_NE(done, std::string::npos) << out;
  const std::string done_line = out.substr(done, out.find('\n', done) - done);
  EXPECT_TRUE(done_line.ends_with(" (step " + std::to_string(last_trained) + ")")) << done_line;
}

// AdamW's bias correction counts updates: the first update after steps without targets is
// corrected as the first, as torch's AdamW counts its step() calls. Then every weight moves by
// lr * g / (|g| + eps), at most lr; corrected as update t it moved by at most
// lr * (1 - b1) / (1 - b1^t) / sqrt((1 - b2) / (1 - b2^t)), 0.74 lr at t = 2.
TEST_F(Training, FirstUpdateAfterStepsWithoutTargetsIsCorrectedAsTheFirst) {
  std::string out;
  write_sparse_target_data(root + "/masked");
  const std::string dir = root + "/late";
  const std::string flags = "--set packing=padded --set micro_batch_size=1 --set gradient_accumulation_steps=1 "
                            "--set eval_steps=0 --set warmup_steps=0 --set weight_decay=0 --set lr_scheduler_type=constant";
  ASSERT_EQ(0, train(tiny_config(root + "/masked", dir, 12, 1), "late", flags + " --set save_total_limit=20", &out)) << out;
  std::vector<int64_t> trained;  // the steps with targets
  for (const nlohmann::json& j : metrics_records(dir + "/metrics.jsonl"))
    if (!j.at("loss").is_null()) trained.push_back(j.at("step").get<int64_t>());
  ASSERT_GE(trained.size(), 2u) << "fewer than two steps had targets; change the data or the seed\n" << out;
  const int64_t first = trained[0];
  ASSERT_GE(first, 2) << "step 1 had targets; change the data or the seed\n" << out;
  const std::string before = dir + "/checkpoint-" + std::to_string(first - 1), after = dir + "/checkpoint-" + std::to_string(first);
  EXPECT_EQ(nlohmann::json::parse(read_file(before + "/trainer_state.json")).at("updates"), 0);
  EXPECT_EQ(nlohmann::json::parse(read_file(after + "/trainer_state.json")).at("updates"), 1);
  const auto w0 = ingot::io::SafeTensorsReader::open(before + "/model.safetensors");
  const auto w1 = ingot::io::SafeTensorsReader::open(after + "/model.safetensors");
  double largest = 0;
  for (const std::string& name : w0.names()) {
    const ingot::io::SafeTensorInfo &a = w0.get(name), &b = w1.get(name);
    ASSERT_EQ(a.dtype, ingot::DType::f32) << name;
    for (int64_t i = 0; i < a.numel(); ++i)
      largest = std::max(largest, std::fabs(double(static_cast<const float*>(b.data)[i]) - static_cast<const float*>(a.data)[i]));
  }
  EXPECT_GT(largest, 0.99e-2) << "the largest weight change of the first update, learning_rate 1e-2";
  EXPECT_LT(largest, 1.0001e-2);

  // Resumed after that update, the run keeps counting updates where it stopped (a count restarted
  // from the step would change every later update's bits).
  ASSERT_EQ(0, train(tiny_config(root + "/masked", root + "/split", static_cast<int>(first), 0), "split", flags, &out)) << out;
  ASSERT_EQ(0, train(tiny_config(root + "/masked", root + "/split", 12, 0), "split", flags + " --resume", &out)) << out;
  EXPECT_EQ(read_file(root + "/split/checkpoint-12/model.safetensors"), read_file(dir + "/checkpoint-12/model.safetensors"));
}

// A model trained from scratch without an eos_token_id takes the data's end-of-text id (meta.json's
// eos_id), so its checkpoints and exports say where documents end; an explicit one is kept.
TEST_F(Training, FromScratchModelTakesTheDatasEosId) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 1, 0), "run", "", &out)) << out;
  EXPECT_NE(out.find("note: eos_token_id 256 from the data's meta.json"), std::string::npos) << out;
  EXPECT_EQ(nlohmann::json::parse(read_file(root + "/run/checkpoint-1/config.json")).at("eos_token_id"), 256);
  // Resumed, the run keeps its checkpoints' id, whatever the data's meta.json says by then (an edit
  // made it 5, and a deleted meta.json dropped it, without a word).
  nlohmann::json meta = nlohmann::json::parse(read_file(data + "/meta.json"));
  meta["eos_id"] = 5;
  write_file(data + "/meta.json", meta.dump());
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 2, 0), "run", "--resume", &out)) << out;
  EXPECT_EQ(nlohmann::json::parse(read_file(root + "/run/checkpoint-2/config.json")).at("eos_token_id"), 256);
  meta["eos_id"] = 256;
  write_file(data + "/meta.json", meta.dump());
  std::string config = tiny_config(data, root + "/own", 1, 0);
  config.replace(config.find("  vocab_size"), 0, "  eos_token_id: 3\n");
  ASSERT_EQ(0, train(config, "own", "", &out)) << out;
  EXPECT_EQ(nlohmann::json::parse(read_file(root + "/own/checkpoint-1/config.json")).at("eos_token_id"), 3);
  // An eos_id that is no token id of the model (an edited or damaged meta.json) is said: the
  // checkpoints lost their end of text without a word, and generate never stopped.
  for (const nlohmann::json& bad : {nlohmann::json(99999), nlohmann::json("256"), nlohmann::json(256.5)}) {
    meta["eos_id"] = bad;
    write_file(data + "/meta.json", meta.dump());
    ASSERT_EQ(0, train(tiny_config(data, root + "/bad_eos", 1, 0), "bad_eos", "--overwrite", &out)) << out;
    EXPECT_NE(out.find("warning: " + data + "/meta.json: eos_id " + bad.dump() +
                       " is not a token id of this model (vocab_size 257), so eos_token_id stays unset"),
              std::string::npos) << out;
    EXPECT_TRUE(nlohmann::json::parse(read_file(root + "/bad_eos/checkpoint-1/config.json")).at("eos_token_id").is_null());
  }
  meta["eos_id"] = 256;
  write_file(data + "/meta.json", meta.dump());
  // Folders whose end-of-text ids differ: the id stays unset, and the note says why (it was silent,
  // and transformers' generate on the export never stopped).
  const std::string tokenizer = ingot::test::source_dir() + "/tests/fixtures/chat/llama3_tokenizer";
  ASSERT_EQ(0, run_command(cli() + " prepare " + root + "/text --tokenizer " + tokenizer + " -o " + root + "/d1", &out)) << out;
  ASSERT_EQ(0, run_command(cli() + " prepare " + root + "/text --tokenizer " + tokenizer + " -o " + root +
                               "/d2 --eos-token '<|end_of_text|>'", &out)) << out;
  std::string mixed = tiny_config(root + "/d1", root + "/mixed", 1, 0);
  mixed.replace(mixed.find("vocab_size: 257"), 15, "vocab_size: 515");
  ASSERT_EQ(0, train(mixed, "mixed", "--set 'train_data=[" + root + "/d1, " + root + "/d2]'", &out)) << out;
  EXPECT_NE(out.find("note: the train_data folders' meta.json files give different end-of-text ids ("), std::string::npos)
      << out;
  EXPECT_TRUE(nlohmann::json::parse(read_file(root + "/mixed/checkpoint-1/config.json")).at("eos_token_id").is_null());
  // A dataset that lost the tokenizer.json its meta.json lists is named before step 1: checkpoints
  // without it decoded as bytes, and generate printed garbage without a word.
  fs::remove(root + "/d1/tokenizer.json");
  EXPECT_NE(0, train(mixed, "lost", "--set output_dir=" + root + "/lost", &out));
  EXPECT_NE(out.find(root + "/d1/meta.json lists the tokenizer file tokenizer.json the data was prepared with, and " +
                     root + "/d1 no longer holds it"), std::string::npos) << out;
}

// Settings that quietly do less than they say get a line: a warm-up as long as the run (the peak
// learning rate is never reached), a wsd warm-up into the decay, and eval_steps without validation data.
TEST_F(Training, NamesAWarmupLongerThanTheRunAndEvaluationWithoutData) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 2, 0), "run", "--set warmup_steps=4 --set val_fraction=0", &out)) << out;
  EXPECT_NE(out.find("warning: --set warmup_steps=4: warmup_steps 4 is not below max_steps 2: the learning rate never "
                     "reaches learning_rate 0.01 (at most 0.0025)"), std::string::npos) << out;
  EXPECT_NE(out.find("note: --set val_fraction=0: no validation data (val_fraction 0), so eval_steps 3 evaluates nothing"),
            std::string::npos) << out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 3, 0), "run", "--overwrite --set warmup_steps=2", &out)) << out;
  EXPECT_EQ(out.find("warmup_steps 2 is not below"), std::string::npos) << out;
  EXPECT_EQ(out.find("evaluates nothing"), std::string::npos) << out;
  // A wsd warm-up that runs into the decay (the last 0.2 of 10 steps start at step 8): the rate
  // jumps down from 8/9 of the peak to half of it.
  const std::string wsd = "--overwrite --set lr_scheduler_type=wsd --set wsd_decay_ratio=0.2";
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 10, 0), "run", wsd + " --set warmup_steps=9", &out)) << out;
  EXPECT_NE(out.find("warning: --set warmup_steps=9: warmup_steps 9 runs into the wsd decay (the last 0.2 of max_steps 10, "
                     "from step 8): the learning rate never holds at learning_rate, and drops from 0.00888889 to 0.005 "
                     "after the warm-up"), std::string::npos) << out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 10, 0), "run", wsd + " --set warmup_steps=8", &out)) << out;
  EXPECT_EQ(out.find("runs into the wsd decay"), std::string::npos) << out;
  // A long decay (0.9 of 100 steps, from step 10) that the warm-up enters early: the rate rises.
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 100, 0), "run",
                     "--overwrite --set lr_scheduler_type=wsd --set wsd_decay_ratio=0.9 --set warmup_steps=11", &out)) << out;
  EXPECT_NE(out.find("runs into the wsd decay (the last 0.9 of max_steps 100, from step 10): the learning rate never "
                     "holds at learning_rate, and jumps from 0.00909091 to 0.00988889 after the warm-up"),
            std::string::npos) << out;
}

TEST_F(Training, ResumeRepeatsAnUninterruptedRunBitForBit) {
  std::string out;
  // Straight: 8 steps. Interrupted: the same config stopped after 5 (max_steps=5), then resumed to 8.
  ASSERT_EQ(0, train(tiny_config(data, root + "/straight", 8, 0), "straight", "", &out)) << out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/resumed", 8, 0), "resumed", "--set max_steps=5", &out)) << out;
  ASSERT_TRUE(fs::exists(root + "/resumed/checkpoint-5"));
  // Without --resume the old run is protected.
  EXPECT_NE(0, train(tiny_config(data, root + "/resumed", 8, 0), "resumed", "", &out));
  EXPECT_NE(out.find("already holds a run (checkpoint-5;"), std::string::npos) << out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/two", 12, 3), "two", "", &out)) << out;  // checkpoint-9 and -12 kept
  EXPECT_NE(0, train(tiny_config(data, root + "/two", 12, 3), "two", "", &out));
  EXPECT_NE(out.find("already holds a run (checkpoint-12;"), std::string::npos) << "the newest, which --resume takes\n" << out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/resumed", 8, 0), "resumed", "--resume", &out)) << out;
  EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
  EXPECT_NE(out.find("note: resume: max_steps was 5 in the checkpoint, now 8"), std::string::npos) << out;
  // The cosine schedule spans max_steps, so the interrupted leg used max_steps=5 for its lr: compare
  // instead a run that saved mid-way with the same max_steps.
  ASSERT_EQ(0, train(tiny_config(data, root + "/mid", 8, 4), "mid", "", &out)) << out;
  fs::remove_all(root + "/mid/checkpoint-8");
  ASSERT_EQ(0, train(tiny_config(data, root + "/mid", 8, 4), "mid", "--resume", &out)) << out;
  EXPECT_EQ(out.find("note: resume"), std::string::npos) << "the same config changes nothing:\n" << out;
  EXPECT_EQ(loss_lines(root + "/straight/metrics.jsonl"), loss_lines(root + "/mid/metrics.jsonl"));
  EXPECT_EQ(read_file(root + "/straight/checkpoint-8/model.safetensors"),
            read_file(root + "/mid/checkpoint-8/model.safetensors"));
  EXPECT_EQ(read_file(root + "/straight/checkpoint-8/optimizer.safetensors"),
            read_file(root + "/mid/checkpoint-8/optimizer.safetensors"));
  // A finished run resumed again has nothing to do, and its summary says where it stands (it said
  // "done: 0 steps, final loss 0").
  ASSERT_EQ(0, train(tiny_config(data, root + "/mid", 8, 4), "mid", "--resume", &out)) << out;
  EXPECT_NE(out.find("nothing to do: the run already reached max_steps 8"), std::string::npos) << out;
  EXPECT_NE(out.find("done: step 8 of 8\n"), std::string::npos) << out;
  // Below the checkpoint's step, max_steps is refused (it printed "nothing to do" and exited 0).
  EXPECT_NE(0, train(tiny_config(data, root + "/mid", 5, 4), "mid", "--resume", &out));
  EXPECT_NE(out.find("mid.yaml: max_steps 5 is below the step of the checkpoint --resume continues, " + root +
                     "/mid/checkpoint-8 (step 8)"), std::string::npos) << out;
}

// A resumed run keeps its architecture: a change that alters no shape (rope_theta here) was taken
// silently, the loss jumped, and the run's checkpoints disagreed on config.json.
TEST_F(Training, ResumeRefusesAnotherArchitecture) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 2, 0), "run", "", &out)) << out;
  std::string changed = tiny_config(data, root + "/run", 3, 0);
  changed.replace(changed.find("  vocab_size"), 0, "  rope_theta: 500000.0\n");
  EXPECT_NE(0, train(changed, "changed", "--resume", &out));
  EXPECT_NE(out.find("changed.yaml: --resume: rope_theta is 500000.0 in this run's model but 10000.0 in " + root +
                     "/run/checkpoint-2/config.json; a resumed run keeps its architecture"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(root + "/run/checkpoint-3"));
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 3, 0), "run", "--resume", &out)) << out;
  // A change of shape is named the same way. It failed as the weights loaded: a shape mismatch in
  // model.safetensors that told the user to move the newest checkpoint out. The key named is the
  // one changed, not the head_dim that follows from it (which came first in name order).
  std::string wider = tiny_config(data, root + "/run", 4, 0);
  wider.replace(wider.find("hidden_size: 32"), 15, "hidden_size: 64");
  EXPECT_NE(0, train(wider, "wider", "--resume", &out));
  EXPECT_NE(out.find("wider.yaml: --resume: hidden_size is 64 in this run's model but 32 in " + root +
                     "/run/checkpoint-3/config.json; a resumed run keeps its architecture"), std::string::npos) << out;
  // head_dim alone (given in the config, hidden_size kept) is still named.
  std::string heads = tiny_config(data, root + "/run", 4, 0);
  heads.replace(heads.find("  vocab_size"), 0, "  head_dim: 16\n");
  EXPECT_NE(0, train(heads, "heads", "--resume", &out));
  EXPECT_NE(out.find("heads.yaml: --resume: head_dim is 16 in this run's model but 8 in "), std::string::npos) << out;
  EXPECT_EQ(out.find("to resume from the checkpoint before it"), std::string::npos) << out;
}

// A trainer_state.json text field or a metrics.jsonl value of the wrong type is named with its file
// (both printed a bare JSON library error); a null val_loss is no value, not an error.
TEST_F(Training, ResumeNamesMistypedStateAndMetrics) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 2, 0), "run", "", &out)) << out;
  const std::string state_file = root + "/run/checkpoint-2/trainer_state.json", metrics_file = root + "/run/metrics.jsonl";
  const std::string state_text = read_file(state_file), metrics_text = read_file(metrics_file);
  nlohmann::json state = nlohmann::json::parse(state_text);
  state["recipe"] = 5;
  write_file(state_file, state.dump());
  EXPECT_NE(0, train(tiny_config(data, root + "/run", 3, 0), "run", "--resume", &out));
  EXPECT_NE(out.find(state_file + ": key \"recipe\" must be a string, got 5"), std::string::npos) << out;
  // More updates than steps, or not a count.
  for (const nlohmann::json& updates : {nlohmann::json(3), nlohmann::json(-1), nlohmann::json("2")}) {
    state = nlohmann::json::parse(state_text);
    state["updates"] = updates;
    write_file(state_file, state.dump());
    EXPECT_NE(0, train(tiny_config(data, root + "/run", 3, 0), "run", "--resume", &out));
    EXPECT_NE(out.find(state_file + ": key \"updates\" (AdamW updates made) must be an integer from 0 to the step, 2, got " +
                       updates.dump()), std::string::npos) << out;
  }
  write_file(state_file, state_text);

  write_file(metrics_file, "{\"step\":1,\"loss\":5.0,\"lr\":0.0,\"val_loss\":null}\n{\"step\":2,\"loss\":\"x\"}\n");
  EXPECT_NE(0, train(tiny_config(data, root + "/run", 3, 0), "run", "--resume", &out));
  EXPECT_NE(out.find(metrics_file + " line 2: \"loss\" must be a number or null, got \"x\""), std::string::npos) << out;
  // attention_switches printed a bare JSON library error.
  state = nlohmann::json::parse(state_text);
  state["attention_switches"] = nlohmann::json::object();
  write_file(state_file, state.dump());
  EXPECT_NE(0, train(tiny_config(data, root + "/run", 3, 0), "run", "--resume", &out));
  EXPECT_NE(out.find(state_file + ": key \"attention_switches\" must be a string, got {}"), std::string::npos) << out;
  // The recorded settings a resume compares (max_steps, the batch shape, the step settings): a
  // value of another kind showed up only in a resume note ("max_steps was \"3\" in the checkpoint").
  for (const auto& [key, value, kind] : {std::tuple{"max_steps", nlohmann::json("3"), "an integer"},
                                         std::tuple{"seed", nlohmann::json("1"), "an integer"},
                                         std::tuple{"micro_batch_size", nlohmann::json(2.5), "an integer"},
                                         std::tuple{"learning_rate", nlohmann::json("x"), "a number"},
                                         std::tuple{"adam_beta1", nlohmann::json(false), "a number"},
                                         std::tuple{"weight_decay_norms", nlohmann::json(0), "true or false"}}) {
    state = nlohmann::json::parse(state_text);
    ASSERT_TRUE(state.contains(key)) << key;
    state[key] = value;
    write_file(state_file, state.dump());
    EXPECT_NE(0, train(tiny_config(data, root + "/run", 3, 0), "run", "--resume", &out)) << key;
    EXPECT_NE(out.find(state_file + ": key \"" + std::string(key) + "\" must be " + kind + ", got " + value.dump()),
              std::string::npos) << key << "\n" << out;
  }
  write_file(state_file, state_text);
  // With an older checkpoint to go back to, the error names it, as for other damage (the check ran
  // after that hint's place, once the run had said it resumed).
  ASSERT_EQ(0, train(tiny_config(data, root + "/two", 2, 0), "two", "--set save_steps=1", &out)) << out;
  const std::string newest = root + "/two/checkpoint-2/trainer_state.json";
  state = nlohmann::json::parse(read_file(newest));
  state["max_steps"] = "4";
  write_file(newest, state.dump());
  EXPECT_NE(0, train(tiny_config(data, root + "/two", 3, 0), "two", "--resume", &out));
  EXPECT_NE(out.find(newest + ": key \"max_steps\" must be an integer, got \"4\": the checkpoint is damaged\n(to resume "
                     "from the checkpoint before it, " + root + "/two/checkpoint-1"), std::string::npos) << out;
  EXPECT_EQ(out.find("resumed from"), std::string::npos) << out;
  // A FIFO in metrics.jsonl's place blocked the resume for good (and a link to /dev/zero filled the memory).
  fs::remove(metrics_file);
  ASSERT_EQ(0, ::mkfifo(metrics_file.c_str(), 0644));
  EXPECT_NE(0, train(tiny_config(data, root + "/run", 3, 0), "run", "--resume", &out));
  EXPECT_NE(out.find("cannot read the run's metrics " + metrics_file + ": it is not a regular file"), std::string::npos) << out;
  fs::remove(metrics_file);
  // A directory in loss.svg's place failed the run after its last save, every step done.
  fs::remove(root + "/run/loss.svg");
  fs::create_directory(root + "/run/loss.svg");
  write_file(metrics_file, "{\"step\":1,\"loss\":5.0,\"lr\":0.0,\"val_loss\":null}\n");
  EXPECT_NE(0, train(tiny_config(data, root + "/run", 3, 0), "run", "--resume", &out));
  EXPECT_NE(out.find("the run's loss plot " + root + "/run/loss.svg is a directory"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(root + "/run/checkpoint-3"));
  fs::remove(root + "/run/loss.svg");

  write_file(metrics_file, "{\"step\":1,\"loss\":5.0,\"lr\":0.0,\"val_loss\":null}\n");
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 3, 0), "run", "--resume", &out)) << out;
}

// A checkpoint written by a bf16 run on a GPU and resumed on the CPU (fp32): the log says the
// weights and moments are converted. The CPU cannot train bf16, so the checkpoint's record is
// edited to say what a CUDA run writes.
TEST_F(Training, ResumeNamesAChangedPrecision) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 3, 0), "run", "", &out)) << out;
  const std::string state_file = root + "/run/checkpoint-3/trainer_state.json";
  nlohmann::json state = nlohmann::json::parse(read_file(state_file));
  ASSERT_EQ(state.at("recipe"), "fp32") << state.dump();
  state["recipe"] = "bf16 (grads f32, optimizer state bf16, master weights f32)";
  state["precision"] = "bf16";
  std::ofstream(state_file) << state.dump(2);
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 4, 0), "run", "--resume", &out)) << out;
  EXPECT_NE(out.find("note: resume: the checkpoint was trained with precision bf16 (grads f32, optimizer state bf16, "
                     "master weights f32), this run uses fp32: weights and AdamW moments are converted"),
            std::string::npos)
      << out;
  // A checkpoint from before the "recipe" field: the precision names are compared.
  state.erase("recipe");
  std::ofstream(state_file) << state.dump(2);
  fs::remove_all(root + "/run/checkpoint-4");
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 4, 0), "run", "--resume", &out)) << out;
  EXPECT_NE(out.find("trained with precision bf16, this run uses fp32"), std::string::npos) << out;
  // Another batch shape (recorded since 2026-12-01) is named too.
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 5, 0), "run",
                     "--resume --set micro_batch_size=1 --set gradient_accumulation_steps=4", &out)) << out;
  for (const char* note : {"note: resume: micro_batch_size was 2 in the checkpoint, now 1: the steps from here on group",
                           "note: resume: gradient_accumulation_steps was 2 in the checkpoint, now 4"})
    EXPECT_NE(out.find(note), std::string::npos) << note << "\n" << out;
  // So are the schedule's and the optimizer's other settings (recorded since 2026-12-01).
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 6, 0), "run",
                     "--resume --set micro_batch_size=1 --set gradient_accumulation_steps=4 --set warmup_steps=5 "
                     "--set weight_decay=0 --set adam_beta2=0.95 --set train_on_inputs=true", &out)) << out;
  for (const char* note : {"note: resume: warmup_steps was 2 in the checkpoint, now 5: the steps from here on use the new value",
                           "note: resume: weight_decay was 0.1 in the checkpoint, now 0.0",
                           "note: resume: adam_beta2 was 0.999 in the checkpoint, now 0.95",
                           "note: resume: train_on_inputs was false in the checkpoint, now true"})
    EXPECT_NE(out.find(note), std::string::npos) << note << "\n" << out;
  EXPECT_EQ(out.find("note: resume: micro_batch_size"), std::string::npos) << "compared with the newest checkpoint\n" << out;
  // The GPU records of the attention, edited into the newest checkpoint (the CPU records them empty),
  // then resumed for one more step with the same settings.
  auto resume_with_record = [&](int64_t checkpoint, const char* key, const std::string& gpu_value) {
    const std::string file = root + "/run/checkpoint-" + std::to_string(checkpoint) + "/trainer_state.json";
    nlohmann::json recorded = nlohmann::json::parse(read_file(file));
    EXPECT_EQ(recorded.at(key), "") << key;
    recorded[key] = gpu_value;
    std::ofstream(file) << recorded.dump(2);
    EXPECT_EQ(0, train(tiny_config(data, root + "/run", checkpoint + 1, 0), "run",
                       "--resume --set micro_batch_size=1 --set gradient_accumulation_steps=4 --set warmup_steps=5 "
                       "--set weight_decay=0 --set adam_beta2=0.95 --set train_on_inputs=true", &out)) << out;
  };
  // The attention backward's plan follows the GPU memory free at the start; another plan is named.
  resume_with_record(6, "attention_plan", "attention backward on cuDNN in 2 calls");
  EXPECT_NE(out.find("note: resume: the attention backward's plan was \"attention backward on cuDNN in 2 calls\" in the "
                     "checkpoint's run and is \"one call, where cuDNN runs it\" now"), std::string::npos) << out;
  // So are the attention switches a CUDA run had set.
  resume_with_record(7, "attention_switches", "INGOT_ATTENTION=cudnn-fast");
  EXPECT_NE(out.find("note: resume: the attention switches were \"INGOT_ATTENTION=cudnn-fast\" in the checkpoint's run "
                     "and are \"none\" now"), std::string::npos) << out;
  EXPECT_EQ(out.find("attention backward's plan"), std::string::npos) << out;
}

// --resume with model: naming an older checkpoint of the same run (to go back before a divergence)
// is refused with the way to do that; it resumed from the newest without a word.
TEST_F(Training, ResumeRefusesAnOlderCheckpointAsModel) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 4, 2), "run", "--set eval_steps=0", &out)) << out;
  ASSERT_TRUE(fs::exists(root + "/run/checkpoint-2"));
  const std::string tiny = tiny_config(data, root + "/run", 6, 2);
  const std::string rest = tiny.substr(tiny.find("train_data:"));
  EXPECT_NE(0, train("model: " + root + "/run/checkpoint-2\n" + rest, "back", "--resume --set eval_steps=0", &out));
  EXPECT_NE(out.find("back.yaml: --resume continues from the run's newest checkpoint, " + root + "/run/checkpoint-4, not "
                     "from model " + root + "/run/checkpoint-2; to go back to " + root + "/run/checkpoint-2, move the "
                     "checkpoints after it out of " + root + "/run"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(root + "/run/checkpoint-6"));
  ASSERT_EQ(0, train("model: " + root + "/run/checkpoint-4\n" + rest, "newest", "--resume --set eval_steps=0", &out)) << out;
  EXPECT_NE(out.find("resumed from " + root + "/run/checkpoint-4 at step 4"), std::string::npos) << out;
}

// Another val_fraction splits the same tokens into other train windows: the refusal says that,
// where it used to say "a dataset of N tokens ... hold N tokens".
TEST_F(Training, ResumeNamesAChangedValidationSplit) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 2, 0), "run", "", &out)) << out;
  EXPECT_NE(0, train(tiny_config(data, root + "/run", 3, 0), "run", "--resume --set val_fraction=0.3", &out));
  EXPECT_NE(out.find(" validation windows but this run has "), std::string::npos) << out;
  EXPECT_NE(out.find("the training/validation split differs (was val_fraction changed?)"), std::string::npos) << out;
  EXPECT_EQ(out.find("a dataset of"), std::string::npos) << out;
  // The setting and the checkpoint are named (a changed seed said only "saved loader state has seed 7").
  EXPECT_NE(0, train(tiny_config(data, root + "/run", 3, 0), "run", "--resume --set seed=8", &out));
  EXPECT_NE(out.find("error: --set seed=8: --resume from " + root + "/run/checkpoint-2: data: saved loader state has seed "
                     "7 but this run uses seed 8; a resumed run keeps its data settings"),
            std::string::npos) << out;
  // The key that differs is named, not another given by --set (an unchanged sequence_len was blamed).
  EXPECT_NE(0, train(tiny_config(data, root + "/run", 3, 0), "run", "--resume --set sequence_len=16 --set val_fraction=0.3", &out));
  EXPECT_NE(out.find("error: --set val_fraction=0.3: --resume from "), std::string::npos) << out;
  // A damaged cursor is the checkpoint's fault, not the config's.
  const std::string state_file = root + "/run/checkpoint-2/trainer_state.json";
  const std::string state_text = read_file(state_file);
  nlohmann::json state = nlohmann::json::parse(state_text);
  state["data"]["index"] = 99999;
  write_file(state_file, state.dump(2));
  EXPECT_NE(0, train(tiny_config(data, root + "/run", 3, 0), "run", "--resume", &out));
  EXPECT_NE(out.find(state_file + ": key \"data\" (the data loader's cursor): saved loader cursor (epoch 0, index 99999) "
                     "is out of range: the checkpoint is damaged"), std::string::npos) << out;
  EXPECT_EQ(out.find("keeps its data settings"), std::string::npos) << out;
  // A cursor value of the wrong kind is named with the file and key. A fractional index was cut to
  // a whole one, and training went on from another place in the data; the others printed a bare
  // JSON library error.
  for (const auto& [key, value, message] :
       {std::tuple{"index", nlohmann::json(2.5), "key \"index\" must be a non-negative integer, got 2.5"},
        std::tuple{"index", nlohmann::json(-5), "key \"index\" must be a non-negative integer, got -5"},
        std::tuple{"epoch", nlohmann::json("4"), "key \"epoch\" must be a non-negative integer, got \"4\""},
        std::tuple{"num_tokens", nlohmann::json(18446744073709551615ull), "key \"num_tokens\" must be a non-negative integer"},
        std::tuple{"packing", nlohmann::json(3), "key \"packing\" must be a string, got 3"},
        std::tuple{"seed", nlohmann::json(), "key \"seed\" must be a non-negative integer, got null"}}) {
    state = nlohmann::json::parse(state_text);
    state["data"][key] = value;
    write_file(state_file, state.dump(2));
    EXPECT_NE(0, train(tiny_config(data, root + "/run", 3, 0), "run", "--resume", &out)) << key;
    EXPECT_NE(out.find(state_file + ": key \"data\" (the data loader's cursor): " + message), std::string::npos) << out;
  }
  state = nlohmann::json::parse(state_text);
  state["data"].erase("seq_len");
  write_file(state_file, state.dump(2));
  EXPECT_NE(0, train(tiny_config(data, root + "/run", 3, 0), "run", "--resume", &out));
  EXPECT_NE(out.find(state_file + ": key \"data\" (the data loader's cursor): key \"seq_len\" is missing"), std::string::npos) << out;
  write_file(state_file, state_text);

  // Data prepared again to the same counts from other text (here: the same documents, each one's
  // tokens reversed) passed every check of the cursor, and training went on with other tokens.
  const std::string shard_file = data + "/train-00000.bin";
  const std::string original = read_file(shard_file);
  {
    const ingot::data::Shard shard(shard_file);
    ingot::data::ShardData reversed;
    reversed.vocab_size = shard.vocab_size();
    reversed.tokens.resize(static_cast<size_t>(shard.num_tokens()));
    shard.read_tokens(0, shard.num_tokens(), reversed.tokens.data());
    const auto starts = shard.document_starts();
    reversed.document_starts.assign(starts.begin(), starts.end());
    for (size_t d = 0; d < starts.size(); ++d)
      std::reverse(reversed.tokens.begin() + static_cast<int64_t>(starts[d]),
                   d + 1 < starts.size() ? reversed.tokens.begin() + static_cast<int64_t>(starts[d + 1]) : reversed.tokens.end());
    ingot::data::write_shard(shard_file, reversed);
  }
  EXPECT_NE(0, train(tiny_config(data, root + "/run", 3, 0), "run", "--resume", &out));
  EXPECT_NE(out.find("hold other tokens than the dataset the checkpoint trained on (the same 12218 tokens in count, but not "
                     "those sampled at 4096 places): the data was prepared again or changed; a resumed run keeps its data"),
            std::string::npos) << out;
  write_file(shard_file, original);
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 3, 0), "run", "--resume", &out)) << out;
}

// A run killed before its first checkpoint leaves only metrics.jsonl: the refusal offers
// --overwrite, not a --resume that has nothing to resume from.
TEST_F(Training, RunWithoutACheckpointIsNotOfferedResume) {
  std::string out;
  const std::string dir = root + "/unsaved";
  fs::create_directories(dir);
  write_file(dir + "/metrics.jsonl", "{\"step\": 1, \"loss\": 5.0}\n");
  EXPECT_NE(0, train(tiny_config(data, dir, 2, 0), "unsaved", "", &out));
  EXPECT_NE(out.find("already holds a run (metrics.jsonl; a run is metrics.jsonl, loss.svg and checkpoint-*) with no "
                     "checkpoint to resume from; pass --overwrite to replace it"),
            std::string::npos) << out;
  EXPECT_EQ(out.find("--resume"), std::string::npos) << out;
}

// From the bad-input review of 2026-11-30: values that crashed (num_threads, bench --steps 0),
// ran out of memory (num_hidden_layers 1e9, sequence_len 2^32, gradient_accumulation_steps 1e8)
// or were silently replaced or accepted (.inf in model_config, min_lr_ratio 2, generate's
// negative temperature, an unknown device). Each is now an error naming the key or flag.
TEST_F(Training, AbsurdValuesAreRefusedNamingTheKey) {
  std::string out;
  const std::string cfg = tiny_config(data, root + "/run", 2, 0);
  auto refused = [&](const std::string& flags, const std::string& key) {
    EXPECT_NE(0, train(cfg, "run", flags, &out)) << flags;
    EXPECT_NE(out.find(key), std::string::npos) << flags << "\n" << out;
    EXPECT_EQ(out.find("terminate"), std::string::npos) << out;
  };
  refused("--set num_threads=65535", "\"num_threads\" must be between 0 and 1024");
  refused("--set sequence_len=4294967296 --set val_fraction=0", "\"sequence_len\"");
  refused("--set gradient_accumulation_steps=100000000", "\"gradient_accumulation_steps\"");
  refused("--set min_lr_ratio=2", "\"min_lr_ratio\" must be a finite number in [0, 1]");
  refused("--set learning_rate=.inf", "\"learning_rate\" must be a finite number");
  refused("--set output_dir=", "\"output_dir\" must not be empty");
  // train_data errors name the setting; an empty entry and a list written "a,b" are said as such.
  refused("--set train_data=", "--set train_data=: a \"train_data\" entry is empty");
  refused("--set train_data=a,b", "--set train_data=a,b: data: shard path a,b does not exist (a list of paths is written [a, b])");
  // Paths that name nothing usable are refused naming where the path came from (a walkthrough of
  // the README found these three without it).
  write_file(root + "/a_file", "x");
  refused("--set output_dir=" + root + "/a_file",
          "--set output_dir=" + root + "/a_file: output_dir " + root + "/a_file exists and is not a directory");
  const std::string data_part = cfg.substr(cfg.find("train_data"));
  EXPECT_NE(0, train("model: models/nothere\n" + data_part, "model", "", &out));
  EXPECT_NE(out.find(root + "/model.yaml: model: no such model or checkpoint: models/nothere (a relative path is looked "
                     "up from the current directory, then from the config file's folder)"),
            std::string::npos)
      << out;
  EXPECT_NE(0, train("model_config: nothere/config.json\n" + data_part, "model_config", "", &out));
  EXPECT_NE(out.find(root + "/model_config.yaml: model_config: cannot read model config nothere/config.json"), std::string::npos)
      << out;
  EXPECT_NE(out.find("then from the config file's folder"), std::string::npos) << out;
  std::string inf_theta = cfg;
  inf_theta.replace(inf_theta.find("  tie_word_embeddings"), 0, "  rope_theta: .inf\n");
  EXPECT_NE(0, train(inf_theta, "inf", "", &out));
  EXPECT_NE(out.find("model_config.rope_theta must be a finite number, got .inf"), std::string::npos) << out;
  fs::create_directories(root + "/a_directory");
  EXPECT_NE(0, run_command(cli() + " train " + root + "/a_directory", &out));
  EXPECT_NE(out.find("it is a directory"), std::string::npos) << out;

  EXPECT_EQ(2, run_command(cli() + " trian " + root + "/a_directory", &out));
  EXPECT_NE(out.find("unknown command \"trian\"; the commands are train, prepare"), std::string::npos) << out;
  // Every command-line mistake exits with 2, as an unknown command does (CLI11's own codes were
  // 105, 106 and 109 by the kind of mistake); help is not a mistake.
  for (const auto& [args, message] :
       {std::pair{"train x.yaml --bogus", "--bogus"},
        std::pair{"", "A subcommand is required"},
        std::pair{"info", "model is required"},
        std::pair{"info x --seq abc", "--seq: must be a plain decimal integer"},
        // An option without its value: CLI11 said "1 required INT missing".
        std::pair{"info x --seq=", "--seq needs a value (INT), and none was given"},
        std::pair{"train x.yaml --set", "--set needs a value (TEXT), and none was given"},
        std::pair{"generate x --seed", "--seed needs a value (UINT), and none was given"},
        // The next option taken for the value: prepare wrote into a folder named --overwrite.
        std::pair{"prepare x -o --overwrite", "--output needs a value, and none was given (--overwrite followed it)"},
        std::pair{"generate m --prompt --seed 3", "--prompt needs a value, and none was given (--seed followed it)"},
        std::pair{"info x --seq --micro-batch 2", "--seq needs a value, and none was given (--micro-batch followed it)"},
        std::pair{"train", "train: a CONFIG.yaml is required"},
        std::pair{"train x.yaml --resume --overwrite", "--resume and --overwrite exclude each other"},
        std::pair{"prepare x -o y --train-on-inputs", "--train-on-inputs applies to --format chat or alpaca"},
        std::pair{"prepare x -o y --chat-date-string '26 Jul 2024'", "--chat-date-string applies to --format chat or alpaca"},
        std::pair{"prepare x -o y --format chat --chat-date-string ''", "--chat-date-string is empty"},
        std::pair{"prepare x -o y --format chat --chat-template ''", "--chat-template is empty"},
        std::pair{"prepare x -o y --overflow drop", "--overflow applies to documents longer than --max-seq-len"}}) {
    EXPECT_EQ(2, run_command(cli() + " " + args, &out)) << args << "\n" << out;
    EXPECT_NE(out.find(message), std::string::npos) << args << "\n" << out;
    EXPECT_EQ(out.rfind("error: ", 0), 0u) << args << "\n" << out;
  }
  EXPECT_EQ(0, run_command(cli() + " train --help", &out)) << out;
  EXPECT_EQ(0, run_command(cli() + " --version", &out)) << out;
  EXPECT_EQ(out.rfind("ingot ", 0), 0u) << out;
  EXPECT_NE(out.find("backend"), std::string::npos) << out;
  // Control bytes of what the user typed are shown escaped: an escape sequence in a path or value
  // could clear the terminal or recolour it, and a carriage return hid the message's start.
  for (const auto& [args, message] :
       {std::pair{"$'tr\\e[2Jian'", "unknown command \"tr\\x1b[2Jian\""},
        std::pair{"$'tr\\xc2\\x9b2Jian'", "unknown command \"tr\\xc2\\x9b2Jian\""},  // UTF-8 CSI
        std::pair{"generate $'nowhere\\r\\e[2K'", "no such model or checkpoint: nowhere\\x0d\\x1b[2K"},
        std::pair{"generate x --temperature $'\\e[31m1'", "--temperature: must be a finite number in plain decimal (no leading 0, no base prefix), got \"\\x1b[31m1\""}}) {
    EXPECT_NE(0, run_command("bash -c \"" + cli() + " " + args + "\"", &out)) << args;
    EXPECT_NE(out.find(message), std::string::npos) << args << "\n" << out;
    EXPECT_EQ(out.find('\x1b'), std::string::npos) << args;
  }
  // Values out of range are command-line mistakes (exit 2), named by their option; so is a --set
  // without its key=value form (it exited 1).
  for (const char* set : {"max_steps", "=5"}) {
    EXPECT_EQ(2, run_command(cli() + " train " + root + "/none.yaml --set " + set, &out)) << set;
    EXPECT_NE(out.find("error: --set: expected key=value, got \"" + std::string(set) + "\""), std::string::npos) << out;
  }
  EXPECT_EQ(2, run_command(cli() + " bench --model qwen2.5-0.5b --device cpu --seq 16 --micro-batch 1 --steps 0", &out));
  EXPECT_NE(out.find("--steps: must lie in [1, 1073741824], got 0"), std::string::npos) << out;
  // Both ends of a range (the upper ends exited 1), and limits that two flags reach together.
  EXPECT_EQ(2, run_command(cli() + " bench --model qwen2.5-0.5b --device cpu --seq 16 --micro-batch 1 --steps 1073741825", &out));
  EXPECT_NE(out.find("--steps: must lie in [1, 1073741824], got 1073741825"), std::string::npos) << out;
  EXPECT_EQ(2, run_command(cli() + " bench --model qwen2.5-0.5b --device cpu --seq 16777217 --micro-batch 1", &out));
  EXPECT_NE(out.find("--seq: must lie in [1, 16777216], got 16777217"), std::string::npos) << out;
  EXPECT_EQ(2, run_command(cli() + " bench --model qwen2.5-0.5b --device cpu --seq 16777216 --micro-batch 17", &out));
  EXPECT_NE(out.find("--micro-batch x --seq = 17 x 16777216 tokens is above the limit of 268435456"), std::string::npos) << out;
  EXPECT_EQ(2, run_command(cli() + " info " + root + "/none --seq 16777216 --micro-batch 17", &out));
  EXPECT_NE(out.find("info: --micro-batch x --seq = 17 x 16777216 tokens is above the limit of 268435456"),
            std::string::npos) << out;
  EXPECT_EQ(2, run_command(cli() + " prepare " + root + "/text --threads 1025 -o " + root + "/many", &out));
  EXPECT_NE(out.find("--threads: must lie in [0, 1024], got 1025"), std::string::npos) << out;
  EXPECT_EQ(2, run_command(cli() + " prepare " + root + "/text --shard-tokens 1099511627777 -o " + root + "/big", &out));
  EXPECT_NE(out.find("--shard-tokens: must lie in [1, 1099511627776], got 1099511627777"), std::string::npos) << out;
  // Flags that do not apply: --eos-token with the byte tokenizer, --list-keys with a run's flags.
  EXPECT_EQ(2, run_command(cli() + " prepare " + root + "/text --eos-token '</s>' -o " + root + "/eos", &out));
  EXPECT_NE(out.find("prepare: --eos-token names a token of a tokenizer.json tokenizer"), std::string::npos) << out;
  EXPECT_EQ(2, run_command(cli() + " train " + root + "/none.yaml --list-keys --resume", &out));
  EXPECT_NE(out.find("train: --list-keys prints the keys and runs nothing"), std::string::npos) << out;
  for (const char* gone : {"/many", "/big", "/eos"}) EXPECT_FALSE(fs::exists(root + gone)) << gone;
  EXPECT_EQ(2, run_command(cli() + " bench --model qwen2.5-0.5b --device cpu --seq 16 --micro-batch 1 --logits-chunk-tokens -1", &out));
  EXPECT_NE(out.find("--logits-chunk-tokens: must be 0 or more, got -1"), std::string::npos) << out;
  EXPECT_EQ(2, run_command(cli() + " prepare " + root + "/text --max-seq-len -5 -o " + root + "/neg", &out));
  EXPECT_NE(out.find("--max-seq-len: must be 0 or more, got -5"), std::string::npos) << out;
  // Flags that do nothing for the format given were ignored without a word.
  for (const auto& [flags, message] :
       {std::pair{"--train-on-inputs", "--train-on-inputs applies to --format chat or alpaca, not to --format text"},
        std::pair{"--format chat --text-field body", "--text-field applies to --format text, not to --format chat"},
        std::pair{"--format alpaca --messages-field m", "--messages-field applies to --format chat, not to --format alpaca"},
        std::pair{"--overflow drop", "--overflow applies to documents longer than --max-seq-len, which is not given"}}) {
    EXPECT_NE(0, run_command(cli() + " prepare " + root + "/text " + flags + " -o " + root + "/flags", &out)) << flags;
    EXPECT_NE(out.find(message), std::string::npos) << flags << "\n" << out;
  }
  EXPECT_FALSE(fs::exists(root + "/flags"));
  EXPECT_EQ(2, run_command(cli() + " bench --model qwen2.5-0.5b --device tpu --seq 16 --micro-batch 1", &out));
  EXPECT_NE(out.find("--device: must be auto, cpu or cuda, got \"tpu\""), std::string::npos) << out;
  // Shapes whose token count overflowed the memory plan (a negative total, "arena overflow").
  EXPECT_EQ(2, run_command(cli() + " bench --model qwen2.5-0.5b --device cpu --seq 9223372036854775807 --micro-batch 1", &out));
  EXPECT_NE(out.find("--seq: must lie in [1, 16777216], got 9223372036854775807"), std::string::npos) << out;
  EXPECT_EQ(2, run_command(cli() + " bench --model qwen2.5-0.5b --device cpu --seq 16 --micro-batch 9223372036854775807", &out));
  EXPECT_NE(out.find("--micro-batch x --seq = 9223372036854775807 x 16 tokens is above the limit"), std::string::npos) << out;
  EXPECT_EQ(2, run_command(cli() + " info " + ingot::test::source_dir() + "/tests/fixtures/llama --micro-batch 9223372036854775807", &out));
  EXPECT_NE(out.find("info: --micro-batch x --seq = 9223372036854775807 x 2048 tokens is above the limit"), std::string::npos)
      << out;

  fs::create_directories(root + "/deep");
  write_file(root + "/deep/config.json",
             R"({"model_type": "llama", "vocab_size": 257, "hidden_size": 32, "intermediate_size": 48,
                 "num_hidden_layers": 1000000000, "num_attention_heads": 4})");
  EXPECT_NE(0, run_command(cli() + " info " + root + "/deep", &out));
  EXPECT_NE(out.find("\"num_hidden_layers\""), std::string::npos) << out;

  ASSERT_EQ(0, train(tiny_config(data, root + "/ok", 1, 0), "ok", "", &out)) << out;
  for (const auto& [flags, message] : {std::pair{"--temperature -1", "--temperature: must be 0 or more, got -1"},
                                       std::pair{"--temperature nan", "--temperature: must be a finite number in plain decimal (no leading 0, no base prefix), got \"nan\""},
                                       // strtod reads hex floats: 0x10 ran at temperature 16.
                                       std::pair{"--temperature 0x10", "--temperature: must be a finite number in plain decimal (no leading 0, no base prefix), got \"0x10\""},
                                       std::pair{"--temperature 010", "got \"010\""},
                                       std::pair{"--temperature 1e999", "--temperature: is out of range: \"1e999\""},
                                       std::pair{"--top-k -1", "--top-k: must be 0 or more, got -1"},
                                       std::pair{"--max-new-tokens -5", "--max-new-tokens: must be 0 or more, got -5"},
                                       std::pair{"--device tpu", "--device: must be auto, cpu or cuda, got \"tpu\""},
                                       std::pair{"--seed -1", "--seed: must be an integer from 0 to 18446744073709551615"},
                                       std::pair{"--seed 99999999999999999999", "got \"99999999999999999999\""}}) {
    EXPECT_EQ(2, run_command(cli() + " generate " + root + "/ok " + flags, &out)) << flags;
    EXPECT_NE(out.find(message), std::string::npos) << flags << "\n" << out;
  }

  // A NaN in a checkpoint's weights: generate and export refuse it by tensor name (generate used
  // to print garbage and exit 0). The first 4 bytes after the header belong to some f32 tensor.
  fs::copy(root + "/ok/checkpoint-1", root + "/nan_model", fs::copy_options::recursive);
  {
    std::fstream f(root + "/nan_model/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header_bytes = 0;
    f.read(reinterpret_cast<char*>(&header_bytes), 8);
    const uint32_t nan_bits = 0x7fc00000u;
    f.seekp(static_cast<std::streamoff>(8 + header_bytes));
    f.write(reinterpret_cast<const char*>(&nan_bits), 4);
  }
  for (const std::string& command : {" generate " + root + "/nan_model", " export " + root + "/nan_model " + root + "/nan_out"}) {
    EXPECT_NE(0, run_command(cli() + command, &out)) << command;
    EXPECT_NE(out.find("holds a non-finite value"), std::string::npos) << command << "\n" << out;
  }
}

// A finite f64 weight beyond f32's range is named as such (it was called inf or nan, which the file
// does not hold), and a scalar where a vector belongs is printed "()" (it was ")").
TEST_F(Training, WeightsBeyondF32OrOfNoShapeAreNamedAsSuch) {
  const std::string fixture = ingot::test::source_dir() + "/tests/fixtures/llama";
  const auto reader = ingot::io::SafeTensorsReader::open(fixture + "/model.safetensors");
  // root/NAME: the fixture with model.norm.weight stored as f64 of `shape`, every value `value`.
  auto model_with_norm = [&](const std::string& name, std::vector<int64_t> shape, double value) {
    const std::string dir = root + "/" + name;
    fs::create_directories(dir);
    fs::copy_file(fixture + "/config.json", dir + "/config.json");
    std::vector<std::vector<double>> buffers;
    buffers.reserve(reader.names().size());
    std::vector<ingot::io::TensorToWrite> tensors;
    for (const std::string& tensor_name : reader.names()) {
      const bool norm = tensor_name == "model.norm.weight";
      const std::vector<int64_t> dims = norm ? shape : reader.get(tensor_name).shape;
      ingot::Tensor t;
      t.dtype = ingot::DType::f64;
      for (const int64_t d : dims) t.shape[t.ndim++] = d;
      buffers.emplace_back(static_cast<size_t>(t.numel()), value);
      t.data = buffers.back().data();
      if (!norm) reader.read_into(tensor_name, t);
      tensors.push_back({tensor_name, t, norm ? ingot::DType::f64 : ingot::DType::f32});
    }
    ingot::io::write_safetensors(dir + "/model.safetensors", tensors);
    return dir;
  };
  std::string out;
  const std::string huge = model_with_norm("huge_norm", {64}, 1e300);
  EXPECT_NE(0, run_command(cli() + " export " + huge + " " + root + "/out", &out));
  EXPECT_NE(out.find("tensor \"model.norm.weight\" in " + huge + "/model.safetensors holds a non-finite value (inf or "
                     "nan) or one beyond the range of f32, which the f64 weights are read into, at element 0"),
            std::string::npos) << out;
  const std::string scalar = model_with_norm("scalar_norm", {}, 1.0);
  EXPECT_NE(0, run_command(cli() + " export " + scalar + " " + root + "/out", &out));
  EXPECT_NE(out.find("tensor \"model.norm.weight\" in " + scalar + "/model.safetensors has shape () but config.json"),
            std::string::npos) << out;
  // F64 weights are read as f32: the export says it holds them rounded (its f32 was called lossless).
  const std::string wide = model_with_norm("f64_norm", {64}, 1.0 + 1e-12);
  ASSERT_EQ(0, run_command(cli() + " export " + wide + " " + root + "/out", &out)) << out;
  EXPECT_NE(out.find("note: " + wide + " stores weights as F64; Ingot reads them as f32, so the export holds them "
                     "rounded to f32 precision"), std::string::npos) << out;
}

// Starting weights near the float range (an embedding of +-3e38) give a finite loss and a NaN
// gradient norm: named at that step, with the weights to blame; the update went ahead, and the next
// step's NaN loss was blamed on the learning rate.
TEST_F(Training, NonFiniteGradientNormIsNamedAtItsStep) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 1, 0), "run", "--set eval_steps=0", &out)) << out;
  const std::string model = root + "/run/checkpoint-1";
  overwrite_f32_tensor(model + "/model.safetensors", "model.embed_tokens.weight",
                       [](uint64_t k) { return k % 2 ? 3e38f : -3e38f; });
  const std::string tiny = tiny_config(data, root + "/ft", 3, 0);
  EXPECT_NE(0, train("model: " + model + "\n" + tiny.substr(tiny.find("train_data:")), "ft", "--set eval_steps=0", &out));
  EXPECT_NE(out.find("nan at step 1 (loss "), std::string::npos) << out;
  EXPECT_NE(out.find("at the first update of this run (values near the float range overflow in the backward); check the "
                     "starting weights (" + model + ")"), std::string::npos) << out;
}

// A resumed checkpoint whose moments are finite but absurd (every exp_avg 1e38: a damaged
// optimizer.safetensors) breaks the weights at the run's first update, and the next step's NaN
// loss names that checkpoint's optimizer state; it blamed the learning rate alone.
TEST_F(Training, DivergenceAfterTheFirstResumedUpdateNamesTheCheckpointsOptimizerState) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 2, 2), "run", "--set eval_steps=0", &out)) << out;
  const std::string ckpt = root + "/run/checkpoint-2";
  overwrite_f32_tensor(ckpt + "/optimizer.safetensors", "exp_avg", [](uint64_t) { return 1e38f; });
  EXPECT_NE(0, train(tiny_config(data, root + "/run", 4, 2), "run", "--resume --set eval_steps=0", &out));
  EXPECT_NE(out.find("at step 4"), std::string::npos) << out;
  EXPECT_NE(out.find("; lower learning_rate or max_grad_norm, or check the data, or the optimizer state "
                     "(optimizer.safetensors) of the checkpoint this run resumed from, " + ckpt +
                     ", which the run's first update applied"),
            std::string::npos) << out;
}

// Replacing something never loses it to a failed attempt: a train --overwrite that fails keeps
// the old run, export refuses to write over the checkpoint it reads, a prepare --overwrite that
// fails keeps the old dataset, and a damaged trainer_state.json is named on resume.
TEST_F(Training, FailedReplacementsKeepWhatWasThere) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 3, 0), "run", "", &out)) << out;
  const std::string weights = read_file(root + "/run/checkpoint-3/model.safetensors");
  ASSERT_FALSE(weights.empty());
  // lr 1e300 sends the weights to infinity at the first update: the new run fails at step 2 (without
  // weight decay, which such a learning rate would make refuse the config).
  EXPECT_NE(0, train(tiny_config(data, root + "/run", 3, 0), "run",
                     "--overwrite --set learning_rate=1e300 --set weight_decay=0", &out));
  EXPECT_NE(out.find("the loss is nan at step 3; lower learning_rate or max_grad_norm"), std::string::npos) << out;
  EXPECT_EQ(read_file(root + "/run/checkpoint-3/model.safetensors"), weights) << "the old run was not put back";
  for (const auto& entry : fs::directory_iterator(root + "/run"))
    EXPECT_EQ(entry.path().filename().string().find(".replaced-run"), std::string::npos) << entry.path();
  // A successful --overwrite replaces it and leaves no hidden copy.
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 2, 0), "run", "--overwrite", &out)) << out;
  EXPECT_FALSE(fs::exists(root + "/run/checkpoint-3"));
  EXPECT_TRUE(fs::exists(root + "/run/checkpoint-2"));
  for (const auto& entry : fs::directory_iterator(root + "/run"))
    EXPECT_EQ(entry.path().filename().string().find(".replaced-run"), std::string::npos) << entry.path();

  const std::string ckpt = root + "/run/checkpoint-2";
  for (const std::string& target : {ckpt, root + "/run"}) {
    EXPECT_NE(0, run_command(cli() + " export " + ckpt + " " + target + " --overwrite", &out)) << target;
    EXPECT_NE(out.find("choose another output"), std::string::npos) << out;
  }
  EXPECT_TRUE(fs::exists(ckpt + "/optimizer.safetensors"));
  EXPECT_TRUE(fs::exists(ckpt + "/trainer_state.json"));
  // Nor into the file system's root, which `--overwrite` wrote into. (From a copy with damaged
  // weights, so that an export that passed the check would still fail before writing there.)
  fs::create_directories(root + "/damaged");
  for (const char* name : {"config.json", "model.safetensors"}) fs::copy_file(ckpt + "/" + name, root + "/damaged/" + name);
  fs::resize_file(root + "/damaged/model.safetensors", 100);
  EXPECT_EQ(1, run_command(cli() + " export " + root + "/damaged / --overwrite", &out));
  EXPECT_NE(out.find("error: export: output / is the file system's root; give the model a folder of its own"),
            std::string::npos) << out;
  // A folder of the user's under the name of a file the export writes: --overwrite deleted it.
  fs::create_directories(root + "/exported/model.safetensors/notes");
  write_file(root + "/exported/model.safetensors/notes/keep.txt", "mine");
  EXPECT_NE(0, run_command(cli() + " export " + ckpt + " " + root + "/exported --overwrite", &out));
  EXPECT_NE(out.find("export: " + root + "/exported holds a folder named model.safetensors where the export writes a file"),
            std::string::npos) << out;
  EXPECT_EQ(read_file(root + "/exported/model.safetensors/notes/keep.txt"), "mine");
  // An output below a file (it printed a raw filesystem error about a temporary name).
  write_file(root + "/a_file", "x");
  EXPECT_NE(0, run_command(cli() + " export " + ckpt + " " + root + "/a_file/sub", &out));
  EXPECT_NE(out.find("export: cannot create output " + root + "/a_file/sub: " + root + "/a_file is not a directory"),
            std::string::npos)
      << out;

  const std::string meta = read_file(data + "/meta.json"), shard = read_file(data + "/train-00000.bin");
  write_file(root + "/empty.txt", "");
  EXPECT_NE(0, run_command(cli() + " prepare " + root + "/empty.txt -o " + data + " --overwrite", &out));
  EXPECT_NE(out.find("is empty"), std::string::npos) << out;
  EXPECT_EQ(read_file(data + "/meta.json"), meta);
  EXPECT_EQ(read_file(data + "/train-00000.bin"), shard);

  write_file(ckpt + "/trainer_state.json", R"({"step": "two"})");
  EXPECT_NE(0, train(tiny_config(data, root + "/run", 4, 0), "run", "--resume", &out));
  EXPECT_NE(out.find("trainer_state.json: key \"step\" must be a non-negative integer"), std::string::npos) << out;
}

// save_total_limit keeps the newest checkpoints and nothing else (no partial folder is left).
TEST_F(Training, RotationKeepsTheNewestCheckpoints) {
  std::string out;
  const std::string dir = root + "/rotated";
  ASSERT_EQ(0, train(tiny_config(data, dir, 5, 1), "rotated", "--set save_total_limit=2", &out)) << out;
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().rfind("checkpoint-", 0) == 0) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"checkpoint-4", "checkpoint-5"})) << out;
}

// An update that sends the weights to inf is caught when they would be saved: with
// save_total_limit 1 the broken checkpoint used to replace the last good one, which rotation then
// deleted (and --resume refuses a checkpoint holding inf).
TEST_F(Training, NonFiniteWeightsAreNeverSaved) {
  std::string out;
  const std::string dir = root + "/diverged";
  ASSERT_EQ(0, train(tiny_config(data, dir, 3, 1), "diverged", "--set save_total_limit=1", &out)) << out;
  const std::string good = read_file(dir + "/checkpoint-3/model.safetensors");
  EXPECT_NE(0, train(tiny_config(data, dir, 6, 1), "diverged", "--resume --set save_total_limit=1 --set learning_rate=1e300 --set weight_decay=0",
                     &out));
  EXPECT_NE(out.find("the weights after step 4 hold a non-finite value (parameter "), std::string::npos) << out;
  EXPECT_NE(out.find("not saved, and no older checkpoint deleted; the newest good checkpoint is " + dir + "/checkpoint-3"),
            std::string::npos) << out;
  EXPECT_EQ(read_file(dir + "/checkpoint-3/model.safetensors"), good);
  EXPECT_FALSE(fs::exists(dir + "/checkpoint-4"));
}

// Diverged weights never cost the run its last good checkpoint (a review, 2026-12-03). Every value
// of the weights can be finite while the forward overflows (lr 1e12: saved, and rotation deleted the
// checkpoint before it, exit 0), or the weights can be dead, every output the same (lr 1e6: the loss
// is finite, so they are saved; the next step fails). Now the first validation batch runs through
// the weights before a save, an evaluation's nan stops the run, and rotation (save_total_limit)
// waits until a later step has trained soundly on the newest checkpoint.
TEST_F(Training, DivergedWeightsNeverReplaceTheLastGoodCheckpoint) {
  std::string out;
  const std::string dir = root + "/diverging";
  const std::string limit1 = "--set save_total_limit=1";
  ASSERT_EQ(0, train(tiny_config(data, dir, 3, 1), "diverging", limit1, &out)) << out;
  EXPECT_EQ(ingot::list_checkpoints(dir), std::vector<std::string>{dir + "/checkpoint-3"}) << "rotation at the run's end";
  const std::string good = read_file(dir + "/checkpoint-3/model.safetensors");
  const std::string diverge = limit1 + " --resume --set weight_decay=0 --set max_grad_norm=0 --set learning_rate=";
  EXPECT_NE(0, train(tiny_config(data, dir, 6, 1), "diverging", diverge + "1e12", &out));
  EXPECT_NE(out.find("error: the loss on the first validation batch is nan after step 4: not saved, and no older checkpoint "
                     "deleted; the newest good checkpoint is " + dir + "/checkpoint-3; lower learning_rate, turn clipping on "
                     "(max_grad_norm)"), std::string::npos) << out;
  EXPECT_EQ(ingot::list_checkpoints(dir), std::vector<std::string>{dir + "/checkpoint-3"});
  EXPECT_NE(0, train(tiny_config(data, dir, 6, 1), "diverging", diverge + "1e12 --set eval_steps=1", &out));
  EXPECT_NE(out.find("error: the validation loss is nan after step 4: not saved"), std::string::npos) << out;
  EXPECT_EQ(ingot::list_checkpoints(dir), std::vector<std::string>{dir + "/checkpoint-3"});
  EXPECT_NE(0, train(tiny_config(data, dir, 6, 1), "diverging", diverge + "1e6", &out));
  EXPECT_NE(out.find("error: the gradient norm is nan at step 5"), std::string::npos) << out;
  EXPECT_NE(out.find(dir + "/checkpoint-4 holds the weights this step started from, and --resume would load it: to "
                     "resume from " + dir + "/checkpoint-3, move it out of " + dir), std::string::npos) << out;
  EXPECT_EQ(ingot::list_checkpoints(dir), (std::vector<std::string>{dir + "/checkpoint-3", dir + "/checkpoint-4"}))
      << "checkpoint-4 holds the dead weights; checkpoint-3 must stay";
  EXPECT_EQ(read_file(dir + "/checkpoint-3/model.safetensors"), good);
  // Without validation data a training batch of the step goes through the weights before a save.
  const std::string no_val = root + "/diverging-no-val";
  ASSERT_EQ(0, train(tiny_config(data, no_val, 3, 1), "diverging-no-val", limit1 + " --set val_fraction=0", &out)) << out;
  EXPECT_EQ(ingot::list_checkpoints(no_val), std::vector<std::string>{no_val + "/checkpoint-3"});
  EXPECT_NE(0, train(tiny_config(data, no_val, 6, 1), "diverging-no-val", diverge + "1e12 --set val_fraction=0", &out));
  EXPECT_NE(out.find("error: the loss on a training batch of the step is nan after step 4: not saved"), std::string::npos) << out;
  EXPECT_EQ(ingot::list_checkpoints(no_val), std::vector<std::string>{no_val + "/checkpoint-3"});
  // After a resume, the first update's failure names the checkpoint, not the starting weights.
  fs::remove_all(dir + "/checkpoint-4");
  std::string from_checkpoint;
  EXPECT_NE(0, train(tiny_config(data, dir, 6, 1), "diverging", diverge + "1e300 --set warmup_steps=0", &from_checkpoint));
  EXPECT_EQ(from_checkpoint.find("starting weights"), std::string::npos) << from_checkpoint;
}

// A gradient norm of exactly 0 with trained targets stops the run: the activations overflowed and
// every output is the same (RMSNorm's f32 sum of squares at infinity), and such a run went on at a
// constant loss of ln 257, saving dead checkpoints, and exited 0.
TEST_F(Training, AVanishedGradientStopsTheRun) {
  std::string tiny = tiny_config(data, root + "/dead", 6, 1);
  tiny.replace(tiny.find("hidden_size: 32"), 15, "hidden_size: 256");
  tiny.replace(tiny.find("intermediate_size: 48"), 21, "intermediate_size: 704");
  std::string out;
  EXPECT_NE(0, train(tiny, "dead", "--set learning_rate=1e3 --set weight_decay=0 --set max_grad_norm=0 --set warmup_steps=0",
                     &out));
  EXPECT_NE(out.find("error: the gradient norm is 0 at step 2 (loss 5.549"), std::string::npos) << out;
  EXPECT_NE(out.find("no parameter gets any gradient"), std::string::npos) << out;
}

// A memorised dataset has a loss and a gradient of exactly 0 too: that is no overflow, and the run
// goes on (the review of the stop above found it stopped "overfit one batch" checks).
TEST_F(Training, AMemorisedBatchIsNoVanishedGradient) {
  const std::string dir = root + "/memorised-data";
  ingot::data::ShardData shard;
  shard.vocab_size = 257;
  shard.tokens.assign(20000, 97);  // "aaaa..."
  shard.document_starts = {0};
  fs::create_directories(dir);
  ingot::data::write_shard(dir + "/train-00000.bin", shard);
  std::string out;
  ASSERT_EQ(0, train(tiny_config(dir, root + "/memorised", 20, 0), "memorised",
                     "--set learning_rate=0.3 --set lr_scheduler_type=constant --set warmup_steps=0 --set weight_decay=0",
                     &out)) << out;
  EXPECT_NE(out.find("step 20/20 | loss 0.0000 | lr 3.000e-01 | grad_norm 0.000"), std::string::npos) << out;
}

// On resume metrics.jsonl keeps the records up to the checkpoint's step and drops a torn last line
// (a crash mid-write, before its newline); a whole line that is no record, with records after it or
// last, stops the resume, naming it, where it was dropped from the rewritten file without a word.
TEST_F(Training, ResumeKeepsMetricsAndNamesADamagedLine) {
  const std::string dir = root + "/metrics";
  fs::create_directories(dir);
  const std::string records = "{\"step\":1,\"loss\":3.0}\n{\"step\":2,\"loss\":2.5}\n{\"step\":3,\"loss\":2.0}\n";
  write_file(dir + "/metrics.jsonl", records + "{\"step\":4,\"lo");
  { ingot::MetricsLog resumed(dir, 2); }
  const std::string kept = read_file(dir + "/metrics.jsonl");
  EXPECT_NE(kept.find("\"step\":2"), std::string::npos) << kept;
  EXPECT_EQ(kept.find("\"step\":3"), std::string::npos) << kept;
  write_file(dir + "/metrics.jsonl", "{\"step\":1,\"loss\":3.0}\n{\"step\":2,\"lo\n" + records);
  const std::string msg = ingot::test::error_of([&] { ingot::MetricsLog resumed(dir, 3); });
  EXPECT_NE(msg.find(dir + "/metrics.jsonl line 2 is not a metrics record: the file was edited or damaged"), std::string::npos) << msg;
  EXPECT_NE(read_file(dir + "/metrics.jsonl").find("{\"step\":2,\"lo\n"), std::string::npos) << "left as it was";
  write_file(dir + "/metrics.jsonl", records + "this is not json\n");
  const std::string last = ingot::test::error_of([&] { ingot::MetricsLog resumed(dir, 3); });
  EXPECT_NE(last.find(dir + "/metrics.jsonl line 4 is not a metrics record"), std::string::npos) << last;
  EXPECT_EQ(read_file(dir + "/metrics.jsonl"), records + "this is not json\n") << "left as it was";
}

// A full disk and a file-size limit are errors naming the file. metrics.jsonl's appends were
// checked before the buffered line was written, so a full disk dropped the log silently; a write
// past `ulimit -f` killed the process with SIGXFSZ and no message.
TEST_F(Training, FullDiskAndFileSizeLimitAreNamedErrors) {
  const std::string dir = root + "/full";
  fs::create_directories(dir);
  ingot::MetricsLog log(dir, -1);
  fs::remove(dir + "/metrics.jsonl");
  fs::create_symlink("/dev/full", dir + "/metrics.jsonl");  // every write fails with ENOSPC
  ingot::MetricsRecord record;
  record.step = 1;
  record.loss = 2.5;
  try {
    log.append(record);
    ADD_FAILURE() << "an append to a full disk passed";
  } catch (const ingot::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot append to " + dir + "/metrics.jsonl"), std::string::npos) << e.what();
  }

  std::string text;
  for (int i = 0; i < 4000; ++i) text += "line " + std::to_string(i) + " of a text too long for the limit\n";
  write_file(root + "/long.txt", text);
  std::string out;
  const int rc = run_command("bash -c 'ulimit -f 8; exec " + cli() + " prepare " + root + "/long.txt -o " + root +
                                 "/limited'",
                             &out);
  EXPECT_EQ(rc, 1) << out;  // 153 was SIGXFSZ
  EXPECT_NE(out.find("File too large"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(root + "/limited")) << "a failed prepare takes back the directory it created";
}

// generate printed each token on its own, so a character whose bytes span tokens came out as
// U+FFFD ("cr\uFFFD\uFFFDme"). The stream holds such a tail back until the character is whole.
TEST(TextStream, CharactersSplitAcrossTokensComeOutWhole) {
  const auto tokenizer =
      ingot::data::BpeTokenizer::from_file(ingot::test::source_dir() + "/tests/fixtures/chat/llama3_tokenizer");
  const std::string text = "la cr\u00e8me br\u00fbl\u00e9e, \u65e5\u672c\u8a9e \U0001F600!";
  const std::vector<int32_t> ids = tokenizer.encode(text);
  ingot::TextStream stream(tokenizer);
  std::string streamed;
  int held = 0;
  for (const int32_t id : ids) {
    const std::string piece = stream.push(id);
    held += piece.empty();
    EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos) << "a split character was printed";
    streamed += piece;
  }
  streamed += stream.flush();
  EXPECT_EQ(streamed, text);
  EXPECT_GT(held, 0) << "no character of the text spans tokens here: the test checks nothing";
}

// Sampling seeds s and s + 1 draw unrelated numbers: counting from the seed itself made seed 2's
// draws seed 1's shifted by one, and adjacent seeds sampled near copies of one text.
TEST(GenerateSampling, AdjacentSeedsDrawUnrelatedNumbers) {
  for (uint64_t seed : {0ull, 1ull, 41ull}) {
    ingot::SplitMixRng a(seed), b(seed + 1);
    std::vector<uint64_t> from_a, from_b;
    for (int i = 0; i < 64; ++i) from_a.push_back(a.next()), from_b.push_back(b.next());
    for (int shift = -63; shift < 64; ++shift)
      for (int i = std::max(0, shift); i < 64 && i - shift < 64; ++i)
        ASSERT_NE(from_a[i], from_b[i - shift]) << "seed " << seed << ", shift " << shift;
  }
}

// The sampler's draws against their distribution: softmax(logits / temperature) over the top_k
// largest logits. top_k 1 is greedy at any temperature; top_k 3 never leaves the three largest
// (ties broken by id) and reaches each; at temperature 0.5 and 2 the counts of 40000 draws fit the
// distribution (chi-square with 5 degrees of freedom below 25, p < 2e-4 by chance). Nothing tested
// --top-k or a temperature other than 0 and 1, where multiplying by it and dividing by it agree.
TEST(GenerateSampling, DrawsFollowSoftmaxOverTheTopK) {
  const std::vector<double> logits = {0.5, 2.0, -1.0, 1.0, 2.0, 0.0};  // ids 1 and 4 tie at the top
  ingot::SplitMixRng rng(3);
  for (int i = 0; i < 200; ++i) ASSERT_EQ(ingot::sample_next_token(logits, 5.0, 1, rng), 1);
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < 3000; ++i) ++counts[size_t(ingot::sample_next_token(logits, 1.0, 3, rng))];
  EXPECT_EQ(counts[0] + counts[2] + counts[5], 0);
  EXPECT_GT(counts[1], 0);
  EXPECT_GT(counts[3], 0);
  EXPECT_GT(counts[4], 0);
  for (const double temperature : {0.5, 2.0}) {
    const int draws = 40000;
    std::vector<int> seen(logits.size(), 0);
    for (int i = 0; i < draws; ++i) ++seen[size_t(ingot::sample_next_token(logits, temperature, 0, rng))];
    double total = 0;
    for (const double l : logits) total += std::exp(l / temperature);
    double chi_square = 0;
    for (size_t id = 0; id < logits.size(); ++id) {
      const double expected = draws * std::exp(logits[id] / temperature) / total;
      chi_square += (seen[id] - expected) * (seen[id] - expected) / expected;
    }
    EXPECT_LT(chi_square, 25.0) << "temperature " << temperature;
  }
}

// A model vocabulary padded past the tokenizer's: ids no text maps to are never sampled (generate
// stopped with "cannot decode id ...").
TEST_F(Training, GenerateNeverSamplesIdsPastTheTokenizer) {
  std::string out, config = tiny_config(data, root + "/padded", 2, 0);
  config.replace(config.find("vocab_size: 257"), 15, "vocab_size: 512");
  ASSERT_EQ(0, train(config, "padded", "", &out)) << out;
  ASSERT_EQ(0, run_command(cli() + " generate " + root + "/padded --prompt 'the ' --max-new-tokens 40 --top-k 0 "
                                   "--temperature 1 --seed 1", &out)) << out;
  EXPECT_EQ(0u, out.find("the ")) << out;
  EXPECT_EQ(out.find("note: "), std::string::npos) << out;  // 4 + 40 tokens fit the 64-token context
  // A prompt past the context is cut to its last max_position_embeddings tokens, with a word; a
  // sample that grows past it slides its window, also said (transformers' would not).
  ASSERT_EQ(0, run_command(cli() + " generate " + root + "/padded --prompt '" + std::string(70, 'a') +
                               "' --max-new-tokens 2 --temperature 0", &out)) << out;
  EXPECT_NE(out.find("warning: the prompt is 70 tokens, above max_position_embeddings 64 of " + root + "/padded"),
            std::string::npos) << out;
  // The last sampled token is never fed back: 4 + 61 tokens fill the 64 positions at most.
  ASSERT_EQ(0, run_command(cli() + " generate " + root + "/padded --prompt 'the ' --max-new-tokens 61 --temperature 0",
                           &out)) << out;
  EXPECT_EQ(out.find("note: "), std::string::npos) << out;
  ASSERT_EQ(0, run_command(cli() + " generate " + root + "/padded --prompt 'the ' --max-new-tokens 62 --temperature 0",
                           &out)) << out;
  EXPECT_NE(out.find("note: the prompt's 4 tokens plus --max-new-tokens 62 pass max_position_embeddings 64 of " + root +
                     "/padded/checkpoint-2: from there on the model sees the last 64 tokens"),
            std::string::npos) << out;
}

// Generation stops where transformers' would: on generation_config.json's eos_token_id (a list
// here, every id of the vocabulary, so nothing is generated), not only on the tokenizer's eos.
// --tokenizer byte overrides a checkpoint's tokenizer.json.
// The stop ids as transformers' generate takes them (checked against transformers 5.24 by a
// review): generation_config.json's eos_token_id where the file is, even when it has none (no
// fallback to config.json then), else config.json's; never the tokenizer's eos_token, on which
// Ingot stopped texts that transformers continued.
TEST_F(Training, GenerationStopIdsAreTransformers) {
  const std::string dir = root + "/model";
  fs::create_directories(dir);
  ingot::ModelConfig config;
  config.vocab_size = 515;
  config.eos_token_ids = {1, 4};
  EXPECT_EQ(ingot::generation_stop_ids(dir, config), (std::vector<int64_t>{1, 4}));
  write_file(dir + "/generation_config.json", R"({"eos_token_id": 7})");
  EXPECT_EQ(ingot::generation_stop_ids(dir, config), (std::vector<int64_t>{7}));
  write_file(dir + "/generation_config.json", R"({"do_sample": true})");
  EXPECT_TRUE(ingot::generation_stop_ids(dir, config).empty());
  write_file(dir + "/generation_config.json", R"({"eos_token_id": null})");
  EXPECT_TRUE(ingot::generation_stop_ids(dir, config).empty());
  fs::remove(dir + "/generation_config.json");
  config.eos_token_ids.clear();
  config.eos_token_id = -1;  // unset: nothing stops it, as in transformers
  EXPECT_TRUE(ingot::generation_stop_ids(dir, config).empty());
}

TEST_F(Training, GenerateStopsOnTheModelsEosIds) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 1, 0), "run", "--set eval_steps=0", &out)) << out;
  const std::string checkpoint = root + "/run/checkpoint-1";
  ASSERT_EQ(0, run_command(cli() + " generate " + checkpoint + " --prompt 'the ' --max-new-tokens 8 --temperature 0", &out)) << out;
  EXPECT_GT(out.size(), std::string("the \n").size()) << out;
  std::string all_ids = "[0";
  for (int id = 1; id < 257; ++id) all_ids += "," + std::to_string(id);
  write_file(checkpoint + "/generation_config.json", "{\"eos_token_id\": " + all_ids + "]}");
  ASSERT_EQ(0, run_command(cli() + " generate " + checkpoint + " --prompt 'the ' --max-new-tokens 8 --temperature 0 2>/dev/null", &out)) << out;
  EXPECT_EQ(out, "the \n");
  ASSERT_EQ(0, run_command(cli() + " generate " + checkpoint + " --prompt 'the ' --max-new-tokens 9223372036854775807", &out)) << out;
  write_file(checkpoint + "/generation_config.json", "{\"eos_token_id\": \"x\"}");
  EXPECT_NE(0, run_command(cli() + " generate " + checkpoint + " --prompt 'the '", &out));
  EXPECT_NE(out.find(checkpoint + "/generation_config.json: eos_token_id must be an integer or a list of integers"),
            std::string::npos) << out;
  write_file(checkpoint + "/generation_config.json", "{\"eos_token_id\": 18446744073709551615}");  // was read as -1: none
  EXPECT_NE(0, run_command(cli() + " generate " + checkpoint + " --prompt 'the '", &out));
  EXPECT_NE(out.find("generation_config.json: eos_token_id 18446744073709551615 holds an id beyond any vocabulary"),
            std::string::npos) << out;
  // An id the model cannot produce never stops generation; it was accepted without a word.
  for (const std::string& ids : {"257", "[3, 99999]", "-5"}) {
    write_file(checkpoint + "/generation_config.json", "{\"eos_token_id\": " + ids + "}");
    EXPECT_NE(0, run_command(cli() + " generate " + checkpoint + " --prompt 'the '", &out)) << ids;
    EXPECT_NE(out.find(checkpoint + "/generation_config.json: eos_token_id holds "), std::string::npos) << out;
    EXPECT_NE(out.find(", outside the vocabulary of 257 of " + checkpoint + "/config.json"), std::string::npos) << out;
  }
  write_file(checkpoint + "/generation_config.json", "{\"eos_token_id\": []}");  // none, as in config.json
  ASSERT_EQ(0, run_command(cli() + " generate " + checkpoint + " --prompt 'the ' --max-new-tokens 2", &out)) << out;
  // One that is no object, which transformers cannot load, was passed over with its stop ids.
  write_file(checkpoint + "/generation_config.json", "[1, 2]");
  EXPECT_NE(0, run_command(cli() + " generate " + checkpoint + " --prompt 'the '", &out));
  EXPECT_NE(out.find(checkpoint + "/generation_config.json: a generation config must be a JSON object, got [1,2]"),
            std::string::npos) << out;
  // A broken link in its place (a cache snapshot whose blob is gone) was taken for no file.
  fs::remove(checkpoint + "/generation_config.json");
  fs::create_symlink(root + "/gone.json", checkpoint + "/generation_config.json");
  EXPECT_NE(0, run_command(cli() + " generate " + checkpoint + " --prompt 'the '", &out));
  EXPECT_NE(out.find(checkpoint + "/generation_config.json is a symbolic link to " + root + "/gone.json, which does not exist"),
            std::string::npos) << out;
  fs::remove(checkpoint + "/generation_config.json");
  // So was one in place of tokenizer.json: text was read and written as bytes.
  fs::create_symlink(root + "/gone.json", checkpoint + "/tokenizer.json");
  EXPECT_NE(0, run_command(cli() + " generate " + checkpoint + " --prompt 'the '", &out));
  EXPECT_NE(out.find(checkpoint + "/tokenizer.json is a symbolic link to "), std::string::npos) << out;
  fs::remove(checkpoint + "/tokenizer.json");
  write_file(checkpoint + "/tokenizer.json", "not a tokenizer");
  ASSERT_EQ(0, run_command(cli() + " generate " + checkpoint + " --tokenizer byte --prompt 'the ' --max-new-tokens 2", &out)) << out;
  // A window too large to allocate names what set its length (it named only the bytes it asked for).
  nlohmann::json config = nlohmann::json::parse(read_file(checkpoint + "/config.json"));
  config["max_position_embeddings"] = int64_t{1} << 62;
  write_file(checkpoint + "/config.json", config.dump());
  EXPECT_EQ(1, run_command(cli() + " generate " + checkpoint + " --tokenizer byte --max-new-tokens 1000000000000", &out));
  EXPECT_NE(out.find("(the model is sized for a window of 1000000000001 tokens: the prompt's 1 plus --max-new-tokens "
                     "1000000000000, at most max_position_embeddings 4611686018427387904 of " + checkpoint +
                     "/config.json; a smaller --max-new-tokens needs less)"), std::string::npos) << out;
}

// generate, info and bench print their result: when it cannot be written (a full disk; a closed
// pipe, SIGPIPE being ignored) the command fails, where it exited 0 with the text lost. generate
// stops at the first failed write instead of sampling on for no reader.
TEST_F(Training, OutputThatCannotBeWrittenFailsTheCommand) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 1, 0), "run", "--set eval_steps=0", &out)) << out;
  const std::string checkpoint = root + "/run/checkpoint-1";
  // In a subshell: run_command's 2>&1 would send the message to /dev/full too.
  EXPECT_EQ(1, run_command("(" + cli() + " generate " + checkpoint + " --prompt 'the ' --max-new-tokens 4 >/dev/full)", &out));
  EXPECT_NE(out.find("error: generate: cannot write"), std::string::npos) << out;
  EXPECT_EQ(1, run_command("(" + cli() + " info " + checkpoint + " >/dev/full)", &out));
  EXPECT_NE(out.find("error: info: cannot write to standard output (No space left on device)"), std::string::npos) << out;
  // --version and --help too (they exited 0 with the text lost).
  for (const std::string flag : {"--version", "--help", "train --help"}) {
    EXPECT_EQ(1, run_command("(" + cli() + " " + flag + " >/dev/full)", &out)) << flag;
    EXPECT_NE(out.find("cannot write to standard output"), std::string::npos) << flag << ": " << out;
  }
  // A pipe whose reader is gone before generate starts (a reader that left; SIGPIPE is ignored):
  // the first failed write stops it, where 10^9 tokens would take hours.
  int fds[2];
  ASSERT_EQ(0, ::pipe(fds));
  ::close(fds[0]);
  // Greedy: its first tokens are no end of text (checked above), so the sampling loop meets the failure.
  const int rc = std::system((cli() + " generate " + checkpoint + " --prompt 'the ' --temperature 0 "
                              "--max-new-tokens 1000000000 1>&" + std::to_string(fds[1]) + " 2>" + root + "/gen.err").c_str());
  ::close(fds[1]);
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 1) << rc;
  EXPECT_NE(read_file(root + "/gen.err").find("error: generate: cannot write the generated text (Broken pipe)"),
            std::string::npos) << read_file(root + "/gen.err");
}

// Non-finite logits stop generation with the reason; sampling from them printed arbitrary tokens
// and exited 0. Finite weights can still overflow: the final norm's weights here are 3e38.
TEST_F(Training, GenerateRefusesNonFiniteLogits) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 1, 0), "run", "--set eval_steps=0", &out)) << out;
  const std::string checkpoint = root + "/run/checkpoint-1";
  std::string weights = read_file(checkpoint + "/model.safetensors");
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, weights.data(), sizeof header_bytes);
  const nlohmann::json norm = nlohmann::json::parse(weights.substr(8, header_bytes))["model.norm.weight"];
  ASSERT_EQ(norm["dtype"], "F32");
  const size_t begin = 8 + header_bytes + norm["data_offsets"][0].get<size_t>();
  const size_t end = 8 + header_bytes + norm["data_offsets"][1].get<size_t>();
  const float huge = 3e38f;
  for (size_t at = begin; at < end; at += sizeof huge) std::memcpy(weights.data() + at, &huge, sizeof huge);
  write_file(checkpoint + "/model.safetensors", weights);
  EXPECT_NE(0, run_command(cli() + " generate " + checkpoint + " --prompt 'the ' --max-new-tokens 4 --temperature 0", &out));
  EXPECT_NE(out.find("the weights or config.json of " + checkpoint + " give non-finite values"), std::string::npos) << out;
  // The prompt printed so far ends its line; the error began on it ("the error: ...").
  EXPECT_NE(out.find("the \nerror: generate: "), std::string::npos) << out;
}

// SIGTERM (or Ctrl-C) stops a prepare between documents as a failure does: no staging folder with
// partial shards is left, nor the output directories it created. It used to die at once and leave
// them. The input is large enough (~70 MB of JSON Lines) that the prepare is still running when
// the signal comes, once its staging folder exists.
TEST_F(Training, PrepareStopsCleanlyOnSigterm) {
  std::string lines;
  for (int i = 0; i < 2000000; ++i) lines += "{\"text\": \"document number " + std::to_string(i) + " of the test\"}\n";
  write_file(root + "/big.jsonl", lines);
  const std::string out_dir = root + "/made/for/it";
  write_file(root + "/stop_prepare.sh",
             "\"$1\" prepare \"$2\" -o \"$3\" >\"$4\" 2>&1 &\npid=$!\n"
             "for i in $(seq 1200); do ls -A \"$3\" 2>/dev/null | grep -q '^.prepare-' && break; sleep 0.01; done\n"
             "kill -TERM $pid\nwait $pid\n");
  std::string out;
  EXPECT_EQ(1, run_command("bash " + root + "/stop_prepare.sh " + cli() + " " + root + "/big.jsonl " + out_dir + " " +
                               root + "/prepare.log", &out)) << out;
  const std::string log = read_file(root + "/prepare.log");
  EXPECT_NE(log.find("error: prepare: stopped by SIGTERM; nothing was written"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(root + "/made")) << "the directories the prepare created are gone with its staging folder";
}

// The file system's refusals name the export and the path (they were bare "filesystem error"
// lines), and an output name that fits is not refused for its temporary name's suffix.
TEST_F(Training, ExportNamesWhatTheFileSystemRefuses) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 1, 0), "run", "--set eval_steps=0", &out)) << out;
  fs::create_symlink("nowhere", root + "/dangling");
  for (const std::string& output : {root + "/dangling", root + "/dangling/sub"}) {
    EXPECT_NE(0, run_command(cli() + " export " + root + "/run " + output, &out)) << output;
    EXPECT_NE(out.find("export: cannot create output " + output + ": " + root +
                       "/dangling is a symbolic link to nowhere, which does not exist"), std::string::npos) << out;
  }
  fs::create_symlink("loop_b", root + "/loop_a");
  fs::create_symlink("loop_a", root + "/loop_b");
  EXPECT_NE(0, run_command(cli() + " export " + root + "/run " + root + "/loop_a/sub", &out));
  EXPECT_NE(out.find("error: export " + root + "/run -> " + root + "/loop_a/sub: Too many levels of symbolic links"),
            std::string::npos) << out;
  const std::string longest(255, 'x');  // NAME_MAX on Linux file systems
  ASSERT_EQ(0, run_command(cli() + " export " + root + "/run " + root + "/" + longest, &out)) << out;
  EXPECT_TRUE(fs::exists(root + "/" + longest + "/model.safetensors"));
  EXPECT_NE(0, run_command(cli() + " export " + root + "/run " + root + "/" + longest + "y", &out));
  EXPECT_NE(out.find(longest + "y: File name too long"), std::string::npos) << out;
}

// A model's companion files are checked before a run trains or an export writes: a folder named
// generation_config.json failed the first checkpoint save after all the training (leaving a partial
// checkpoint folder), and a broken JSON file was copied into every checkpoint and export.
TEST_F(Training, BrokenCompanionFilesStopTheRunBeforeStepOne) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 1, 0), "run", "--set eval_steps=0", &out)) << out;
  const std::string model = root + "/run/checkpoint-1";
  const std::string tiny = tiny_config(data, root + "/ft", 2, 1);
  const std::string fine_tune = "model: " + model + "\n" + tiny.substr(tiny.find("train_data:"));
  fs::create_directories(model + "/generation_config.json");
  EXPECT_NE(0, train(fine_tune, "ft", "--set eval_steps=0", &out));
  EXPECT_NE(out.find("cannot read companion file " + model + "/generation_config.json: it is a directory"),
            std::string::npos) << out;
  EXPECT_FALSE(fs::exists(root + "/ft/metrics.jsonl"));  // refused before the run's files were made
  fs::remove(model + "/generation_config.json");
  write_file(model + "/tokenizer_config.json", "{\"eos_token\": ");
  EXPECT_NE(0, train(fine_tune, "ft", "--set eval_steps=0 --overwrite", &out));
  EXPECT_NE(out.find("companion file " + model + "/tokenizer_config.json is not valid JSON"), std::string::npos) << out;
  EXPECT_NE(0, run_command(cli() + " export " + model + " " + root + "/exported", &out));
  EXPECT_NE(out.find("companion file " + model + "/tokenizer_config.json is not valid JSON"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(root + "/exported"));
  // A broken link was taken for no file: the export went out without it, and exit 0.
  fs::remove(model + "/tokenizer_config.json");
  fs::create_symlink(root + "/gone.json", model + "/tokenizer_config.json");
  EXPECT_NE(0, run_command(cli() + " export " + model + " " + root + "/exported", &out));
  EXPECT_NE(out.find(model + "/tokenizer_config.json is a symbolic link to " + root + "/gone.json, which does not exist"),
            std::string::npos) << out;
  EXPECT_FALSE(fs::exists(root + "/exported"));
  fs::remove(model + "/tokenizer_config.json");
  ASSERT_EQ(0, train(fine_tune, "ft", "--set eval_steps=0 --overwrite", &out)) << out;
  for (const auto& entry : fs::directory_iterator(root + "/ft"))
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << entry.path();
}

// A config.json whose sizes disagree with the weights (a typo in intermediate_size) is named from
// the headers, before any buffer of its size: export printed "error: std::bad_alloc", then (with the
// allocation checked) the gigabytes it asked for; generate and train allocated the model first.
TEST_F(Training, ExportNamesAConfigThatDisagreesWithTheWeights) {
  const std::string model = root + "/huge";
  fs::create_directories(model);
  fs::copy_file(ingot::test::source_dir() + "/tests/fixtures/llama/model.safetensors", model + "/model.safetensors");
  nlohmann::json config = nlohmann::json::parse(read_file(ingot::test::source_dir() + "/tests/fixtures/llama/config.json"));
  config["hidden_size"] = 8192;
  config["head_dim"] = 128;
  config["num_attention_heads"] = 64;
  config["num_key_value_heads"] = 8;
  config["intermediate_size"] = 1048576;
  config["num_hidden_layers"] = 40;
  write_file(model + "/config.json", config.dump());
  std::string out;
  EXPECT_NE(0, run_command("ulimit -v 4000000; " + cli() + " export " + model + " " + root + "/out", &out));
  EXPECT_NE(out.find(" has shape ("), std::string::npos) << out;
  EXPECT_NE(out.find(" but config.json of " + model + " gives it ("), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(root + "/out"));
}

// prepare refuses a run's folder and a checkpoint, as export does: it wrote shards and meta.json
// beside the weights.
TEST_F(Training, PrepareRefusesARunsFolderAndACheckpoint) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 1, 0), "run", "--set eval_steps=0", &out)) << out;
  for (const std::string& target : {root + "/run", root + "/run/checkpoint-1"}) {
    EXPECT_NE(0, run_command(cli() + " prepare " + root + "/text -o " + target + " --overwrite", &out));
    EXPECT_NE(out.find("prepare: output directory " + target + " holds a training run or a checkpoint ("),
              std::string::npos) << out;
    EXPECT_FALSE(fs::exists(target + "/meta.json"));
  }
}

// So do train and generate, from a checkpoint whose config.json was edited.
TEST_F(Training, TrainAndGenerateNameAConfigThatDisagreesWithTheWeights) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 1, 0), "run", "--set eval_steps=0", &out)) << out;
  const std::string model = root + "/run/checkpoint-1";
  nlohmann::json config = nlohmann::json::parse(read_file(model + "/config.json"));
  config["intermediate_size"] = 4096;
  write_file(model + "/config.json", config.dump());
  const std::string tiny = tiny_config(data, root + "/ft", 1, 0);
  EXPECT_NE(0, train("model: " + model + "\n" + tiny.substr(tiny.find("train_data:")), "ft", "", &out));
  EXPECT_NE(out.find("\"model.layers.0.mlp.gate_proj.weight\" in " + model + "/model.safetensors has shape (48,32) but "
                     "config.json of " + model + " gives it (4096,32)"), std::string::npos) << out;
  EXPECT_NE(0, run_command(cli() + " generate " + model + " --prompt a --max-new-tokens 1", &out));
  EXPECT_NE(out.find("has shape (48,32) but config.json of " + model + " gives it (4096,32)"), std::string::npos) << out;
}

// export writes what it was asked for, against the checkpoint's own f32 weights: --dtype f16 and
// bf16 store every tensor in that dtype, each value the checkpoint's rounded to nearest even once,
// and config.json's torch_dtype names it (transformers' torch_dtype="auto" loads by it); the
// default keeps f32. --max-shard-size splits the weights into shards with an index whose map
// names every tensor. Parsing f16 as bf16, a fixed torch_dtype or a CLI that ignored the shard
// size passed every test.
TEST_F(Training, ExportWritesTheDtypeAndShardsAskedFor) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 2, 2), "run", "--set eval_steps=0", &out)) << out;
  const auto checkpoint = ingot::io::SafeTensorsReader::open(root + "/run/checkpoint-2/model.safetensors");
  struct Case {
    const char* flags;
    ingot::DType dtype;
    const char* torch_dtype;
  };
  for (const Case& c : {Case{"", ingot::DType::f32, "float32"}, Case{"--dtype bf16", ingot::DType::bf16, "bfloat16"},
                        Case{"--dtype f16", ingot::DType::f16, "float16"},
                        Case{"--dtype bf16 --max-shard-size 20KB", ingot::DType::bf16, "bfloat16"}}) {
    SCOPED_TRACE(c.flags);
    const std::string dir = root + "/hf";
    ASSERT_EQ(0, run_command(cli() + " export " + root + "/run " + dir + " --overwrite " + c.flags, &out)) << out;
    const auto config = nlohmann::json::parse(read_file(dir + "/config.json"));
    EXPECT_EQ(config["torch_dtype"], c.torch_dtype);
    const bool sharded = std::string(c.flags).find("max-shard-size") != std::string::npos;
    EXPECT_EQ(fs::exists(dir + "/model.safetensors.index.json"), sharded);
    EXPECT_EQ(fs::exists(dir + "/model.safetensors"), !sharded);
    const auto exported = ingot::io::SafeTensorsReader::open(dir);
    ASSERT_EQ(exported.names(), checkpoint.names());
    if (sharded) {
      const auto index = nlohmann::json::parse(read_file(dir + "/model.safetensors.index.json"));
      std::vector<std::string> mapped;
      std::set<std::string> files;
      for (const auto& [name, file] : index["weight_map"].items()) mapped.push_back(name), files.insert(file.get<std::string>());
      std::sort(mapped.begin(), mapped.end());
      EXPECT_EQ(mapped, checkpoint.names());
      EXPECT_GT(files.size(), 1u);
      for (const std::string& file : files) {
        const auto shard = ingot::io::SafeTensorsReader::open(dir + "/" + file);
        int64_t bytes = 0;
        for (const std::string& name : shard.names()) bytes += shard.get(name).bytes;
        EXPECT_TRUE(bytes <= 20000 || shard.names().size() == 1) << file << ": " << bytes << " bytes";
      }
    }
    for (const std::string& name : checkpoint.names()) {
      const ingot::io::SafeTensorInfo& want = checkpoint.get(name);
      const ingot::io::SafeTensorInfo& got = exported.get(name);
      ASSERT_EQ(want.dtype, ingot::DType::f32) << name;
      ASSERT_EQ(got.dtype, c.dtype) << name;
      ASSERT_EQ(got.numel(), want.numel()) << name;
      const float* w = static_cast<const float*>(want.data);
      int64_t differing = 0;
      for (int64_t i = 0; i < want.numel(); ++i) {
        float value = 0;
        if (c.dtype == ingot::DType::f32) {
          std::memcpy(&value, static_cast<const char*>(got.data) + 4 * i, 4);
          differing += value != w[i];
        } else {
          uint16_t bits = 0;
          std::memcpy(&bits, static_cast<const char*>(got.data) + 2 * i, 2);
          const uint16_t expected = c.dtype == ingot::DType::bf16 ? ingot::f32_to_bf16(w[i]) : ingot::f32_to_f16(w[i]);
          differing += bits != expected;
        }
      }
      EXPECT_EQ(differing, 0) << name;
    }
  }
}

TEST_F(Training, ExportGenerateAndInfo) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 3, 0), "run", "", &out)) << out;
  ASSERT_EQ(0, run_command(cli() + " export " + root + "/run " + root + "/hf", &out)) << out;
  EXPECT_TRUE(fs::exists(root + "/hf/config.json"));
  EXPECT_TRUE(fs::exists(root + "/hf/model.safetensors"));
  // Export refuses to clobber a non-empty directory.
  EXPECT_NE(0, run_command(cli() + " export " + root + "/run " + root + "/hf", &out));
  EXPECT_NE(out.find("--overwrite"), std::string::npos) << out;
  // "hf/" and "hf/." name hf itself. The temporary folder used to land inside it, and --overwrite
  // then deleted the old export with it and failed.
  for (const std::string& spelled : {root + "/hf/", root + "/hf/."}) {
    ASSERT_EQ(0, run_command(cli() + " export " + root + "/run " + spelled + " --overwrite --dtype bf16", &out))
        << spelled << ": " << out;
    EXPECT_TRUE(fs::exists(root + "/hf/config.json")) << spelled;
    EXPECT_TRUE(fs::exists(root + "/hf/model.safetensors")) << spelled;
  }
  // Not inside the checkpoint it reads: rotation would delete the export with the checkpoint.
  EXPECT_NE(0, run_command(cli() + " export " + root + "/run " + root + "/run/checkpoint-3/hf", &out));
  EXPECT_NE(out.find("lies inside the checkpoint"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(root + "/run/checkpoint-3/hf"));
  ASSERT_EQ(0, run_command(cli() + " export " + root + "/run " + root + "/hf2/", &out)) << out;
  EXPECT_TRUE(fs::exists(root + "/hf2/model.safetensors"));
  // An existing directory is filled in place, never renamed: it may be a mount point (a
  // container's volume), which rename() refuses. Its inode stays, empty or --overwrite.
  fs::create_directories(root + "/volume");
  struct stat before {}, after {};
  ASSERT_EQ(0, ::stat((root + "/volume").c_str(), &before));
  ASSERT_EQ(0, run_command(cli() + " export " + root + "/run " + root + "/volume", &out)) << out;
  // --overwrite replaces the export's own files, an older export's extra shards and a killed
  // export's folders, and keeps the rest (a hub clone's README.md and .git); it deleted everything.
  // A companion file this export does not write (the byte-level run has no tokenizer.json) is the
  // user's, and stays; it used to be deleted.
  write_file(root + "/volume/README.md", "model card");
  write_file(root + "/volume/tokenizer.json", "the user's own tokenizer");
  fs::create_directories(root + "/volume/.git");
  write_file(root + "/volume/model-00002-of-00002.safetensors", "a shard of an older, sharded export");
  fs::create_directories(root + "/volume/.export-old-12345");
  ASSERT_EQ(0, run_command(cli() + " export " + root + "/run " + root + "/volume --overwrite --dtype bf16", &out)) << out;
  ASSERT_EQ(0, ::stat((root + "/volume").c_str(), &after));
  EXPECT_EQ(before.st_ino, after.st_ino) << "the output directory was replaced, not filled";
  EXPECT_EQ(read_file(root + "/volume/model.safetensors"), read_file(root + "/hf/model.safetensors"));
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(root + "/volume")) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{".git", "README.md", "config.json", "model.safetensors", "tokenizer.json"}))
      << "the old export's entries are gone, the rest stays";
  EXPECT_EQ(read_file(root + "/volume/tokenizer.json"), "the user's own tokenizer");
  EXPECT_NE(out.find("note: kept " + root + "/volume/tokenizer.json, which " + root + "/run/checkpoint-3 has no copy of"),
            std::string::npos) << out;
  // A training run's folder or a dataset's is refused, --overwrite or not.
  for (const std::string& folder : {root + "/run", data}) {
    EXPECT_NE(0, run_command(cli() + " export " + root + "/hf " + folder + " --overwrite", &out)) << folder;
    EXPECT_NE(out.find("holds a training run, a checkpoint or a dataset"), std::string::npos) << out;
  }
  // So is a new checkpoint-<N> (or partial checkpoint's name) in a run's folder: it became the
  // run's newest checkpoint, which generate and --resume then read.
  for (const std::string& name : {"checkpoint-999", "checkpoint-3.tmp-1/"}) {
    EXPECT_NE(0, run_command(cli() + " export " + root + "/hf " + root + "/run/" + name, &out)) << name;
    EXPECT_NE(out.find("would be a checkpoint of the training run in " + root + "/run"), std::string::npos) << out;
  }
  EXPECT_FALSE(fs::exists(root + "/run/checkpoint-999"));
  EXPECT_TRUE(fs::exists(root + "/run/checkpoint-3/optimizer.safetensors"));
  EXPECT_TRUE(fs::exists(data + "/train-00000.bin"));
  for (const auto& entry : fs::directory_iterator(root))  // no temporary or set-aside folders left
    EXPECT_EQ(entry.path().filename().string().find("hf."), std::string::npos) << entry.path();
  ASSERT_EQ(0, run_command(cli() + " export " + root + "/run " + root + "/hf --overwrite", &out)) << out;  // f32 again
  ASSERT_EQ(0, run_command(cli() + " generate " + root + "/hf --prompt 'the ' --max-new-tokens 20 --seed 3", &out)) << out;
  EXPECT_EQ(0u, out.find("the ")) << out;
  EXPECT_GT(out.size(), 4u);
  std::string again;
  ASSERT_EQ(0, run_command(cli() + " generate " + root + "/run --prompt 'the ' --max-new-tokens 20 --seed 3", &again));
  EXPECT_EQ(out, again);  // a checkpoint and its export sample the same text
  ASSERT_EQ(0, run_command(cli() + " info " + root + "/hf --seq 16 --micro-batch 2", &out)) << out;
  EXPECT_NE(out.find("parameters:"), std::string::npos) << out;
  EXPECT_EQ(out.find("warning"), std::string::npos) << out;
  // Past the model's 64 positions a --seq is warned of, as train and bench warn (not the default 2048).
  ASSERT_EQ(0, run_command(cli() + " info " + root + "/hf --seq 65", &out)) << out;
  EXPECT_NE(out.find("warning: --seq 65 is above max_position_embeddings 64 of " + root + "/hf"), std::string::npos) << out;
  ASSERT_EQ(0, run_command(cli() + " info " + root + "/hf", &out)) << out;
  EXPECT_EQ(out.find("warning"), std::string::npos) << out;
  EXPECT_NE(out.find("activations"), std::string::npos) << out;
  EXPECT_NE(out.find("scratch"), std::string::npos) << out;
  // The bf16 recipe's options change the plan (a CUDA plan, computed without a GPU).
  ASSERT_EQ(0, run_command(cli() + " info " + root + "/hf --seq 16 --precision bf16", &out)) << out;
  EXPECT_NE(out.find("bf16 (grads f32, optimizer state f32, master weights f32)"), std::string::npos) << out;
  EXPECT_EQ(out.find("master 0 B"), std::string::npos) << out;
  ASSERT_EQ(0, run_command(cli() + " info " + root + "/hf --seq 16 --precision bf16 --no-master-weights "
                                   "--grad-dtype bf16 --optimizer-state-dtype bf16 --recompute elementwise", &out)) << out;
  EXPECT_NE(out.find("bf16 (grads bf16, optimizer state bf16, no master weights), recompute elementwise"), std::string::npos)
      << out;
  EXPECT_NE(out.find("master 0 B"), std::string::npos) << out;
  EXPECT_EQ(2, run_command(cli() + " info " + root + "/hf --grad-dtype bf16", &out));
  EXPECT_NE(out.find("error: info: --grad-dtype bf16 applies to --precision bf16 (the CUDA recipe), not to --precision "
                     "fp32; leave it out"), std::string::npos) << out;
  // A value of the wrong form is a command-line mistake, exit 2 as README says, naming the option;
  // these exited 1, where other bad values (--temperature abc) exited 2.
  const std::string model = root + "/hf";
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"export " + model + " " + root + "/x --dtype f8", "--dtype: unsupported dtype \"f8\" for export"},
           {"export " + model + " " + root + "/x --max-shard-size 5XB", "--max-shard-size: invalid size unit in \"5XB\""},
           {"generate " + model + " --device tpu", "--device: must be auto, cpu or cuda, got \"tpu\""},
           {"generate " + model + " --top-k -1", "--top-k: must be 0 or more, got -1"},
           {"generate " + model + " --max-new-tokens -5", "--max-new-tokens: must be 0 or more, got -5"},
           {"info " + model + " --precision fp8", "--precision: must be fp32 or bf16, got \"fp8\""},
           {"info " + model + " --recompute all", "--recompute: must be none, elementwise or block, got \"all\""},
           {"info " + model + " --seq 0", "--seq: must lie in [1, 16777216], got 0"},
           {"info " + model + " --no-master-weights", "info: --no-master-weights applies to --precision bf16"},
           {"prepare " + model + " -o " + root + "/x --format chatt", "--format: must be text, chat or alpaca, got \"chatt\""},
           {"prepare " + model + " -o " + root + "/x --format chat --eos-token a",
            "prepare: --eos-token applies to --format text, not to --format chat"},
           {"bench --model llama-3.2-1b --steps 0", "--steps: must lie in [1, 1073741824], got 0"}}) {
    EXPECT_EQ(2, run_command(cli() + " " + args, &out)) << args << ": " << out;
    EXPECT_NE(out.find("error: " + message), std::string::npos) << args << ": " << out;
  }
  EXPECT_FALSE(fs::exists(root + "/x"));
}

// ---- bad input -----------------------------------------------------------------------------------

TEST_F(Training, MissingConfigFile) {
  std::string out;
  EXPECT_NE(0, run_command(cli() + " train " + root + "/nope.yaml", &out));
  EXPECT_NE(out.find("nope.yaml"), std::string::npos) << out;
}

TEST_F(Training, YamlSyntaxErrorNamesFileAndLine) {
  std::string out;
  EXPECT_NE(0, train("learning_rate: 1e-3\nmax_steps: [1, 2\n", "broken", "", &out));
  EXPECT_NE(out.find("broken.yaml"), std::string::npos) << out;
  EXPECT_NE(out.find("line"), std::string::npos) << out;
}

TEST_F(Training, UnknownKeySuggestsClosest) {
  std::string out;
  EXPECT_NE(0, train(tiny_config(data, root + "/x", 2, 0) + "learnig_rate: 0.1\n", "typo", "", &out));
  EXPECT_NE(out.find("learnig_rate"), std::string::npos) << out;
  EXPECT_NE(out.find("did you mean \"learning_rate\""), std::string::npos) << out;
  EXPECT_NE(0, train(tiny_config(data, root + "/x", 2, 0), "ok", "--set warmup_step=3", &out));
  EXPECT_NE(out.find("warmup_steps"), std::string::npos) << out;
}

// bf16 gradients or moments on the CPU (precision auto resolves to fp32 there): refused before
// training, naming where the value came from (the config file, or the --set flag), the key and its value.
TEST_F(Training, Bf16OptionsOnTheCpuNameFileKeyAndValue) {
  std::string out;
  EXPECT_NE(0, train(tiny_config(data, root + "/x", 2, 0) + "device: cpu\noptimizer_state_dtype: bf16\n", "cpubf16", "", &out));
  EXPECT_NE(out.find("cpubf16.yaml: optimizer_state_dtype \"bf16\" needs precision bf16"), std::string::npos) << out;
  EXPECT_NE(0, train(tiny_config(data, root + "/x", 2, 0) + "device: cpu\n", "cpubf16", "--set optimizer_state_dtype=bf16",
                     &out));
  EXPECT_NE(out.find("--set optimizer_state_dtype=bf16: optimizer_state_dtype \"bf16\" needs precision bf16"),
            std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(root + "/x/metrics.jsonl"));
  // master_weights: false was silently ignored here (bad-input review of 2026-12-01).
  EXPECT_NE(0, train(tiny_config(data, root + "/x", 2, 0) + "device: cpu\n", "cpubf16", "--set master_weights=false", &out));
  EXPECT_NE(out.find("--set master_weights=false: master_weights: false needs precision bf16"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(root + "/x/metrics.jsonl"));
}

TEST_F(Training, TokenIdsBeyondVocab) {
  std::string out, config = tiny_config(data, root + "/x", 2, 0);
  config.replace(config.find("vocab_size: 257"), 15, "vocab_size: 100");
  EXPECT_NE(0, train(config, "smallvocab", "", &out));
  EXPECT_NE(out.find("train-00000.bin"), std::string::npos) << out;
  EXPECT_NE(out.find("100"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(root + "/x/metrics.jsonl"));
}

TEST_F(Training, DatasetTooShortForOneSequence) {
  std::string out, config = tiny_config(data, root + "/x", 2, 0);
  config.replace(config.find("sequence_len: 16"), 16, "sequence_len: 60000");
  EXPECT_NE(0, train(config, "short", "", &out));
  EXPECT_NE(out.find("tokens"), std::string::npos) << out;
}

// init_std initialises a model trained from scratch; with model: it did nothing to the loaded
// weights but rewrote initializer_range in the checkpoints' config.json.
TEST_F(Training, InitStdWithAModelToLoadIsRefused) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 1, 0), "run", "", &out)) << out;
  std::string config = tiny_config(data, root + "/ft", 1, 0);
  config = "model: " + root + "/run/checkpoint-1\n" + config.substr(config.find("train_data"));
  EXPECT_NE(0, train(config, "ft", "--set init_std=0.02", &out));
  EXPECT_NE(out.find("--set init_std=0.02: key \"init_std\" sets the initialisation of a model trained from scratch"),
            std::string::npos) << out;
  EXPECT_FALSE(fs::exists(root + "/ft/metrics.jsonl"));
  EXPECT_EQ(0, train(config, "ft", "", &out)) << out;
}

// model: a run's output_dir means its newest checkpoint (as for generate, export and info); a
// file is refused by name; and a model inside the output_dir that --overwrite replaces is refused
// before the old run is moved aside (its weights then "did not exist").
TEST_F(Training, ModelMayBeARunButNotInsideTheRunOverwritten) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 2, 1), "run", "", &out)) << out;
  std::string config = tiny_config(data, root + "/ft", 1, 0);
  config = config.substr(config.find("train_data"));
  ASSERT_EQ(0, train("model: " + root + "/run\n" + config, "ft", "", &out)) << out;
  EXPECT_NE(out.find("model: " + root + "/run/checkpoint-2 (the newest checkpoint of " + root + "/run)"), std::string::npos) << out;
  EXPECT_NE(0, train("model: " + root + "/run/checkpoint-2/model.safetensors\n" + config, "ft", "--overwrite", &out));
  EXPECT_NE(out.find("checkpoint-2/model.safetensors is a file; give the directory that holds config.json"),
            std::string::npos) << out;
  EXPECT_NE(0, train("model: " + root + "/ft/checkpoint-1\n" + config, "ft", "--overwrite", &out));
  EXPECT_NE(out.find("model " + root + "/ft/checkpoint-1 is part of the run in output_dir " + root + "/ft, which --overwrite replaces"),
            std::string::npos) << out;
  EXPECT_TRUE(fs::exists(root + "/ft/checkpoint-1/model.safetensors"));
  // A model elsewhere in output_dir is not part of the run --overwrite moves aside.
  fs::rename(root + "/run/checkpoint-2", root + "/ft/base");
  ASSERT_EQ(0, train("model: " + root + "/ft/base\n" + config, "ft", "--overwrite", &out)) << out;
}

TEST_F(Training, MissingOrMismatchedWeights) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 1, 0), "run", "", &out)) << out;
  const std::string model = root + "/run/checkpoint-1";
  auto finetune = [&](const std::string& model_dir) {
    std::string config = tiny_config(data, root + "/ft", 1, 0);
    config = config.substr(config.find("train_data"));
    return train("model: " + model_dir + "\n" + config, "ft", "--overwrite", &out);
  };
  ASSERT_EQ(0, finetune(model)) << out;

  // Missing weights file.
  fs::create_directories(root + "/noweights");
  fs::copy_file(model + "/config.json", root + "/noweights/config.json");
  EXPECT_NE(0, finetune(root + "/noweights"));
  EXPECT_NE(out.find("noweights"), std::string::npos) << out;

  // root/NAME: the weights of `from` under its config.json with the text `was` replaced by `now`.
  auto with_edited_config = [&](const std::string& name, const std::string& from, const std::string& was,
                                const std::string& now) {
    const std::string dir = root + "/" + name;
    fs::create_directories(dir);
    fs::copy_file(from + "/model.safetensors", dir + "/model.safetensors");
    std::string json = read_file(from + "/config.json");
    const size_t at = json.find(was);
    if (at == std::string::npos) ADD_FAILURE() << from << "/config.json holds no " << was;
    else json.replace(at, was.size(), now);
    write_file(dir + "/config.json", json);
    return dir;
  };

  // Shape disagrees with config.json: widen the MLP in config.json only.
  EXPECT_NE(0, finetune(with_edited_config("badshape", model, "\"intermediate_size\": 48", "\"intermediate_size\": 50")));
  EXPECT_NE(out.find("mlp.gate_proj.weight"), std::string::npos) << out;
  EXPECT_NE(out.find("model.safetensors"), std::string::npos) << out;

  // A missing tensor: an untied config needs lm_head.weight, which a tied checkpoint lacks.
  EXPECT_NE(0, finetune(with_edited_config("missing", model, "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false")));
  EXPECT_NE(out.find("lm_head.weight"), std::string::npos) << out;

  // Truncated weights file.
  fs::create_directories(root + "/truncated");
  fs::copy_file(model + "/config.json", root + "/truncated/config.json");
  const std::string weights = read_file(model + "/model.safetensors");
  write_file(root + "/truncated/model.safetensors", weights.substr(0, weights.size() / 2));
  EXPECT_NE(0, finetune(root + "/truncated"));
  EXPECT_NE(out.find("truncated"), std::string::npos) << out;

  // Weights config.json has no place for (bad-input review of 2026-12-01: they used to vanish from
  // training and export). One layer fewer than the file holds:
  EXPECT_NE(0, finetune(with_edited_config("fewer", model, "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1")));
  EXPECT_NE(out.find("has no place for (\"model.layers.1."), std::string::npos) << out;
  EXPECT_NE(out.find("num_hidden_layers"), std::string::npos) << out;
  // A trained LM head of its own under a config that ties it to the embedding:
  std::string untied = tiny_config(data, root + "/untied", 1, 0);
  untied.replace(untied.find("tie_word_embeddings: true"), 25, "tie_word_embeddings: false");
  ASSERT_EQ(0, train(untied, "untied", "", &out)) << out;
  EXPECT_NE(0, finetune(with_edited_config("retied", root + "/untied/checkpoint-1", "\"tie_word_embeddings\": false",
                                           "\"tie_word_embeddings\": true")));
  EXPECT_NE(out.find("\"lm_head.weight\" in " + root + "/retied/model.safetensors differs from model.embed_tokens.weight"),
            std::string::npos)
      << out;
  // What transformers skips loads too: an lm_head.weight that repeats the tied embedding (Qwen3-0.6B
  // ships one) and RoPE's inv_freq buffers (older Llama exports).
  {
    const auto reader = ingot::io::SafeTensorsReader::open(model + "/model.safetensors");
    std::vector<ingot::io::TensorToWrite> tensors;
    auto host = [](const ingot::io::SafeTensorInfo& info) {
      ingot::Tensor t(const_cast<void*>(info.data), info.dtype, ingot::Device::cpu, {});
      for (int64_t d : info.shape) t.shape[t.ndim++] = d;
      return ingot::io::TensorToWrite{info.name, t, info.dtype};
    };
    for (const std::string& name : reader.names()) tensors.push_back(host(reader.get(name)));
    ingot::io::TensorToWrite head = host(reader.get("model.embed_tokens.weight"));
    head.name = "lm_head.weight";
    tensors.push_back(head);
    std::vector<float> inv_freq(4, 0.5f);
    tensors.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq",
                       ingot::Tensor(inv_freq.data(), ingot::DType::f32, ingot::Device::cpu, {4}), ingot::DType::f32});
    fs::create_directories(root + "/extras");
    fs::copy_file(model + "/config.json", root + "/extras/config.json");
    ingot::io::write_safetensors(root + "/extras/model.safetensors", tensors);
  }
  EXPECT_EQ(0, finetune(root + "/extras")) << out;
}

// A damaged checkpoint is refused by name before it trains (bad-input review of 2026-12-01: a
// negative second moment resumed with exit 0), and a directory named like a checkpoint with a step
// past int64 (it gave "error: stoll") is not taken for one.
TEST_F(Training, DamagedCheckpointsAreRefusedByName) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 3, 0), "run", "", &out)) << out;
  const std::string optimizer_file = root + "/run/checkpoint-3/optimizer.safetensors";
  const std::string original = read_file(optimizer_file);
  // Overwrites the first f32 of `tensor` in the file.
  auto damage = [&](const std::string& tensor, float value) {
    std::string bytes = original;
    uint64_t header_len = 0;
    std::memcpy(&header_len, bytes.data(), 8);
    const auto header = nlohmann::json::parse(bytes.substr(8, header_len));
    const uint64_t begin = header.at(tensor).at("data_offsets").at(0).get<uint64_t>();
    std::memcpy(bytes.data() + 8 + header_len + begin, &value, sizeof value);
    write_file(optimizer_file, bytes);
  };
  const std::string config = tiny_config(data, root + "/run", 5, 0);
  damage("exp_avg_sq", -1.0f);
  EXPECT_NE(0, train(config, "run", "--resume", &out));
  EXPECT_NE(out.find("tensor \"exp_avg_sq\" in " + optimizer_file + " holds a negative or non-finite value at element 0"),
            std::string::npos)
      << out;
  damage("exp_avg", std::numeric_limits<float>::quiet_NaN());
  EXPECT_NE(0, train(config, "run", "--resume", &out));
  EXPECT_NE(out.find("tensor \"exp_avg\" in " + optimizer_file + " holds a non-finite value"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(root + "/run/checkpoint-5")) << "a refused resume wrote a checkpoint";
  write_file(optimizer_file, original);
  fs::create_directories(root + "/run/checkpoint-99999999999999999999");
  // A trainer state whose step is not its directory's (it resumed at that step with the other's cursor).
  const std::string state_file = root + "/run/checkpoint-3/trainer_state.json";
  const std::string state = read_file(state_file);
  nlohmann::json edited = nlohmann::json::parse(state);
  edited["step"] = 2;
  write_file(state_file, edited.dump());
  EXPECT_NE(0, train(config, "run", "--resume", &out));
  EXPECT_NE(out.find(state_file + ": key \"step\" is 2, but the checkpoint directory is checkpoint-3"), std::string::npos)
      << out;
  write_file(state_file, state);
  ASSERT_EQ(0, train(config, "run", "--resume", &out)) << out;
  EXPECT_NE(out.find("resumed from " + root + "/run/checkpoint-3 at step 3"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(root + "/run/checkpoint-5"));
  EXPECT_TRUE(fs::exists(root + "/run/checkpoint-99999999999999999999"));
  // A damaged newest checkpoint with an older one beside it: the error also names the way back.
  write_file(root + "/run/checkpoint-5/model.safetensors", "cut short by a power cut");
  EXPECT_NE(0, train(tiny_config(data, root + "/run", 7, 0), "run", "--resume", &out));
  EXPECT_NE(out.find(root + "/run/checkpoint-5/model.safetensors"), std::string::npos) << out;
  EXPECT_NE(out.find("(to resume from the checkpoint before it, " + root + "/run/checkpoint-3, move " + root +
                     "/run/checkpoint-5 out of " + root + "/run)"),
            std::string::npos) << out;
  // So does damage to its config.json or its data cursor, read before or after the weights (they
  // named only the file; a fuzzing review, 2026-12-02).
  const std::string weights = read_file(root + "/run/checkpoint-3/model.safetensors");
  write_file(root + "/run/checkpoint-5/model.safetensors", weights);  // any readable weights of the right shapes
  const std::string config_file = root + "/run/checkpoint-5/config.json";
  const std::string config_text = read_file(config_file);
  const std::string cursor_file = root + "/run/checkpoint-5/trainer_state.json";
  const std::string cursor_text = read_file(cursor_file);
  nlohmann::json far = nlohmann::json::parse(cursor_text);
  far["data"]["index"] = 99999999;
  for (const auto& [file, text] : {std::pair{config_file, std::string("{garbage")}, std::pair{cursor_file, far.dump()}}) {
    const std::string kept = read_file(file);
    write_file(file, text);
    EXPECT_NE(0, train(tiny_config(data, root + "/run", 7, 0), "run", "--resume", &out));
    EXPECT_NE(out.find(file), std::string::npos) << out;
    EXPECT_NE(out.find("(to resume from the checkpoint before it, " + root + "/run/checkpoint-3, move " + root +
                       "/run/checkpoint-5 out of " + root + "/run)"), std::string::npos) << file << ": " << out;
    write_file(file, kept);
  }
}

// Chat SFT end to end: prepare --format chat with the real Qwen3 tokenizer and template, then train
// a tiny Qwen3-shaped model on the packed, masked shards.
// Chat SFT through the CLI: prepare with the model's chat template, train packed, the tokenizer
// carried into the checkpoint. The repository's Llama 3 fixture tokenizer (515 ids), so CI runs it;
// with ../shared's Qwen3 tokenizer, a Qwen3 model too.
TEST_F(Training, ChatSftPackedEndToEnd) {
  struct Case {
    std::string tokenizer, model_type;
    int vocab;
  };
  std::vector<Case> cases = {{ingot::test::source_dir() + "/tests/fixtures/chat/llama3_tokenizer/tokenizer.json", "llama", 515}};
  const std::string qwen3 = ingot::test::shared_dir() + "/data/tokenizers/qwen3/tokenizer.json";
  if (fs::exists(qwen3)) cases.push_back({qwen3, "qwen3", 151936});
  for (const Case& c : cases) run_chat_sft(c.tokenizer, c.model_type, c.vocab);
}

// The tokenizer files prepare copies beside the shards belong to that dataset: a byte-level
// --overwrite of a BPE dataset removes them (they were left, carried into checkpoints, and generate
// then refused the checkpoint: the tokenizer's 515 ids against the model's 257), and a tokenizer.json
// someone put beside a byte-level dataset is not carried either.
TEST_F(Training, ByteDatasetCarriesNoTokenizerFiles) {
  const std::string tokenizer = ingot::test::source_dir() + "/tests/fixtures/chat/llama3_tokenizer/tokenizer.json";
  const std::string text = root + "/text";
  std::string out;
  ASSERT_EQ(0, run_command(cli() + " prepare " + text + " --tokenizer " + tokenizer + " -o " + root + "/d", &out)) << out;
  ASSERT_TRUE(fs::exists(root + "/d/tokenizer.json"));
  ASSERT_TRUE(fs::exists(root + "/d/tokenizer_config.json"));
  ASSERT_EQ(0, run_command(cli() + " prepare " + text + " --doc-separator % -o " + root + "/d --overwrite", &out)) << out;
  EXPECT_FALSE(fs::exists(root + "/d/tokenizer.json"));
  EXPECT_FALSE(fs::exists(root + "/d/tokenizer_config.json"));
  EXPECT_TRUE(fs::exists(root + "/d/meta.json"));

  write_file(root + "/d/tokenizer.json", read_file(tokenizer));  // put there by hand
  ASSERT_EQ(0, train(tiny_config(root + "/d", root + "/run", 1, 0), "run", "--set eval_steps=0", &out)) << out;
  EXPECT_TRUE(fs::exists(root + "/run/checkpoint-1/model.safetensors"));
  EXPECT_FALSE(fs::exists(root + "/run/checkpoint-1/tokenizer.json"));
  ASSERT_EQ(0, run_command(cli() + " generate " + root + "/run --prompt the --max-new-tokens 4", &out)) << out;
}

// Fine-tuning on data prepared with another tokenizer: the ids fit the model's vocabulary, so
// nothing else noticed, and the checkpoints then carried the data's tokenizer. Refused where the
// vocabularies differ or the data is byte-level; another added token at an id gets a warning.
TEST_F(Training, FineTuningRefusesDataOfAnotherTokenizer) {
  const std::string fixtures = ingot::test::source_dir() + "/tests/fixtures/chat/";
  std::string out;
  for (const char* name : {"llama3", "chatml"})
    ASSERT_EQ(0, run_command(cli() + " prepare " + root + "/text --tokenizer " + fixtures + name + "_tokenizer -o " + root +
                                 "/" + name, &out)) << out;
  std::string config = tiny_config(root + "/llama3", root + "/base", 1, 0);
  config.replace(config.find("vocab_size: 257"), 15, "vocab_size: 515");
  ASSERT_EQ(0, train(config, "base", "--set eval_steps=0", &out)) << out;
  auto fine_tune = [&](const std::string& data, const std::string& name) {
    const std::string tiny = tiny_config(data, root + "/" + name, 1, 0);
    return train("model: " + root + "/base\n" + tiny.substr(tiny.find("train_data:")), name, "--set eval_steps=0", &out);
  };
  const std::string base = root + "/base/checkpoint-1";  // what model: names, a run's newest checkpoint
  EXPECT_NE(0, fine_tune(root + "/chatml", "other"));
  EXPECT_NE(out.find(root + "/chatml was prepared with another tokenizer than model " + base + "'s: id 3 is \"!\" in " +
                     root + "/chatml/tokenizer.json but \"<|end_header_id|>\" in " + base + "/tokenizer.json; prepare "
                     "the data with --tokenizer " + base), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(root + "/other"));
  // The same through a glob (the folder of the shards it matches, not the pattern, is the data's).
  EXPECT_NE(0, fine_tune(root + "/chat*/train-*.bin", "globbed"));
  EXPECT_NE(out.find(root + "/chatml was prepared with another tokenizer than model " + base + "'s: id 3"),
            std::string::npos) << out;
  EXPECT_NE(0, fine_tune(data, "bytes"));
  EXPECT_NE(out.find(data + " holds byte-level data (its meta.json says \"tokenizer\": \"byte\"), but model " + base +
                     " has a tokenizer of its own"), std::string::npos) << out;
  ASSERT_EQ(0, fine_tune(root + "/llama3", "same")) << out;
  EXPECT_EQ(out.find("tokenizer.json has added token"), std::string::npos) << out;

  // The same tokenizer converted otherwise (special tokens only among the added tokens, not in the
  // vocabulary as well): every id names the same token, so no refusal and no warning.
  nlohmann::json converted = nlohmann::json::parse(read_file(fixtures + "llama3_tokenizer/tokenizer.json"));
  for (const nlohmann::json& t : converted["added_tokens"]) converted["model"]["vocab"].erase(t["content"].get<std::string>());
  fs::create_directories(root + "/converted_tokenizer");
  write_file(root + "/converted_tokenizer/tokenizer.json", converted.dump(1));
  ASSERT_EQ(0, run_command(cli() + " prepare " + root + "/text --tokenizer " + root + "/converted_tokenizer -o " + root +
                               "/converted --eos-token '<|end_of_text|>'", &out)) << out;
  ASSERT_EQ(0, fine_tune(root + "/converted", "converted_run")) << out;
  EXPECT_EQ(out.find("tokenizer.json has added token"), std::string::npos) << out;

  // A renamed added token (as with Llama 3's reserved special tokens): the same vocabulary, a warning.
  nlohmann::json renamed = nlohmann::json::parse(read_file(fixtures + "llama3_tokenizer/tokenizer.json"));
  for (nlohmann::json& t : renamed["added_tokens"])
    if (t["id"] == 4) t["content"] = "<|my_turn_end|>";
  fs::create_directories(root + "/renamed_tokenizer");
  write_file(root + "/renamed_tokenizer/tokenizer.json", renamed.dump());
  ASSERT_EQ(0, run_command(cli() + " prepare " + root + "/text --tokenizer " + root + "/renamed_tokenizer -o " + root +
                               "/renamed --eos-token '<|end_of_text|>'", &out)) << out;
  ASSERT_EQ(0, fine_tune(root + "/renamed", "renamed_run")) << out;
  EXPECT_NE(out.find("warning: " + root + "/renamed_run.yaml: " + root + "/renamed/tokenizer.json has added token "
                     "\"<|my_turn_end|>\" at id 4, where " + base + "/tokenizer.json has \"<|eot_id|>\"; "
                     "checkpoints carry the data's tokenizer"), std::string::npos) << out;
}

// A checkpoint written before pad_token_id was read (2026-12-02) holds none in its config.json: a
// run whose config sets one still resumes from it, as for the other token ids (it was refused as a
// change of architecture).
TEST_F(Training, ResumeTakesACheckpointWithoutPadTokenId) {
  std::string out, config = tiny_config(data, root + "/run", 2, 1);
  config.replace(config.find("  tie_word_embeddings: true\n"), 0, "  pad_token_id: 32\n");
  ASSERT_EQ(0, train(config, "first", "--set max_steps=1", &out)) << out;
  const std::string saved = root + "/run/checkpoint-1/config.json";
  nlohmann::json written = nlohmann::json::parse(read_file(saved));
  ASSERT_EQ(written["pad_token_id"], 32);
  written.erase("pad_token_id");
  write_file(saved, written.dump(2));
  ASSERT_EQ(0, train(config, "second", "--resume", &out)) << out;
  EXPECT_TRUE(fs::exists(root + "/run/checkpoint-2/model.safetensors")) << out;
  EXPECT_EQ(nlohmann::json::parse(read_file(root + "/run/checkpoint-2/config.json"))["pad_token_id"], 32);
}

// A chat fine-tune carries the template that rendered its data: the starting model's
// chat_template.jinja (transformers' layout since 4.49) went into every checkpoint beside the
// data's tokenizer_config.json, and transformers renders the .jinja over the config's template.
TEST_F(Training, ChatFineTuneCarriesTheDatasTemplateNotTheModels) {
  const std::string fixtures = ingot::test::source_dir() + "/tests/fixtures/chat/";
  std::string out, jsonl;
  for (int i = 0; i < 40; ++i)
    jsonl += R"({"messages": [{"role": "user", "content": "the cat sat"}, {"role": "assistant", "content": "on a mat"}]})" "\n";
  write_file(root + "/chat.jsonl", jsonl);
  ASSERT_EQ(0, run_command(cli() + " prepare " + root + "/chat.jsonl --format chat --tokenizer " + fixtures +
                               "llama3_tokenizer -o " + root + "/chat", &out)) << out;
  ASSERT_TRUE(fs::exists(root + "/chat/tokenizer_config.json"));
  ASSERT_FALSE(fs::exists(root + "/chat/chat_template.jinja"));
  std::string config = tiny_config(root + "/chat", root + "/base", 1, 0);
  config.replace(config.find("vocab_size: 257"), 15, "vocab_size: 515");
  ASSERT_EQ(0, train(config, "base", "--set eval_steps=0", &out)) << out;
  const std::string base = root + "/base/checkpoint-1";
  write_file(base + "/chat_template.jinja", "{{ 'the model folder's own template' }}");
  const std::string tiny = tiny_config(root + "/chat", root + "/tuned", 1, 0);
  ASSERT_EQ(0, train("model: " + base + "\n" + tiny.substr(tiny.find("train_data:")), "tuned", "--set eval_steps=0", &out))
      << out;
  const std::string tuned = root + "/tuned/checkpoint-1";
  EXPECT_EQ(read_file(tuned + "/tokenizer_config.json"), read_file(root + "/chat/tokenizer_config.json"));
  EXPECT_FALSE(fs::exists(tuned + "/chat_template.jinja"));
  // A dataset without a tokenizer_config.json leaves the model's pair as it was.
  fs::remove(root + "/chat/tokenizer_config.json");
  nlohmann::json meta = nlohmann::json::parse(read_file(root + "/chat/meta.json"));
  meta["tokenizer_files"] = {"tokenizer.json"};
  write_file(root + "/chat/meta.json", meta.dump());
  ASSERT_EQ(0, train("model: " + base + "\n" + tiny.substr(tiny.find("train_data:")), "kept", "--set eval_steps=0 "
                     "--set output_dir=" + root + "/kept", &out)) << out;
  EXPECT_EQ(read_file(root + "/kept/checkpoint-1/chat_template.jinja"), read_file(base + "/chat_template.jinja"));
  // Exported over an export that wrote a chat_template.jinja, a checkpoint whose tokenizer_config.json
  // comes without one is refused: the .jinja left behind would have been the template transformers
  // rendered. Nothing is changed; with the file gone, the export goes through.
  ASSERT_EQ(0, run_command(cli() + " export " + root + "/kept/checkpoint-1 " + root + "/hf", &out)) << out;
  const std::string stale = read_file(root + "/hf/chat_template.jinja");
  const std::string weights = read_file(root + "/hf/model.safetensors");
  EXPECT_NE(0, run_command(cli() + " export " + tuned + " " + root + "/hf --overwrite", &out));
  EXPECT_NE(out.find("export: " + root + "/hf/chat_template.jinja would be the chat template of the "
                     "tokenizer_config.json this export writes"), std::string::npos) << out;
  EXPECT_EQ(read_file(root + "/hf/chat_template.jinja"), stale);
  EXPECT_EQ(read_file(root + "/hf/model.safetensors"), weights);
  fs::remove(root + "/hf/chat_template.jinja");
  ASSERT_EQ(0, run_command(cli() + " export " + tuned + " " + root + "/hf --overwrite", &out)) << out;
  EXPECT_EQ(read_file(root + "/hf/tokenizer_config.json"), read_file(tuned + "/tokenizer_config.json"));
}

// generate's note on a sample that passes the model's positions, up to the prompt's token count
// ("note: the prompt's 24"): how long the prompt was. "no note" where there is none.
static std::string prompt_note(const std::string& generate_output) {
  const size_t at = generate_output.find("note: the prompt's ");
  return at == std::string::npos ? "no note" : generate_output.substr(at, generate_output.find(" tokens", at) - at);
}

// generate --chat samples from the prompt rendered as a user turn plus the assistant's header: the
// same tokens as that text given as a plain prompt (whose special tokens the tokenizer reads whole),
// so the reply is what the plain run writes after the echoed prompt. The reply alone is printed.
TEST_F(Training, GenerateChatRendersTheUserTurnWithTheTemplate) {
  std::string jsonl;
  for (int i = 0; i < 40; ++i)
    jsonl += R"({"messages": [{"role": "user", "content": "the cat sat"}, {"role": "assistant", "content": "on a mat"}]})" "\n";
  std::string out;
  ASSERT_EQ(0, train(llama3_chat_config(jsonl, 2), "run", "--set eval_steps=0", &out)) << out;
  std::string chat, plain;
  ASSERT_EQ(0, run_command(cli() + " generate " + root + "/run --chat --prompt 'the cat sat' --temperature 0 "
                           "--max-new-tokens 6", &chat)) << chat;
  const std::string rendered = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nthe cat sat<|eot_id|>"
                               "<|start_header_id|>assistant<|end_header_id|>\n\n";
  ASSERT_EQ(0, run_command("bash -c \"" + cli() + " generate " + root + "/run --no-special-tokens --temperature 0 "
                           "--max-new-tokens 6 --prompt $'<|begin_of_text|><|start_header_id|>user<|end_header_id|>\\n\\n"
                           "the cat sat<|eot_id|><|start_header_id|>assistant<|end_header_id|>\\n\\n'\"", &plain)) << plain;
  ASSERT_GT(chat.size(), 1u) << chat;  // a reply, then the line's end
  EXPECT_EQ(plain.rfind(rendered + chat.substr(0, chat.size() - 1), 0), 0u) << "chat: " << chat << "\nplain: " << plain;
  EXPECT_EQ(chat.find("the cat sat"), std::string::npos) << chat;  // the prompt is not echoed
  // The flags that only a plain prompt or only --chat takes are refused by name.
  EXPECT_EQ(2, run_command(cli() + " generate " + root + "/run --chat --no-special-tokens --prompt x", &out));
  EXPECT_NE(out.find("--no-special-tokens applies to a plain prompt"), std::string::npos) << out;
  EXPECT_EQ(2, run_command(cli() + " generate " + root + "/run --chat-format llama3 --prompt x", &out));
  EXPECT_NE(out.find("--chat-format applies with --chat"), std::string::npos) << out;
  EXPECT_EQ(2, run_command(cli() + " generate " + root + "/run --system 'Be brief.' --prompt x", &out));
  EXPECT_NE(out.find("--system applies with --chat"), std::string::npos) << out;
  // A system message goes before the user turn, as its own turn under this template. The prompts'
  // lengths show in the note on a sample that passes the model's 64 positions.
  ASSERT_EQ(0, run_command(cli() + " generate " + root + "/run --chat --system 'Be brief.' --prompt 'the cat sat' "
                           "--temperature 0 --max-new-tokens 64", &chat)) << chat;
  ASSERT_EQ(0, run_command("bash -c \"" + cli() + " generate " + root + "/run --no-special-tokens --temperature 0 "
                           "--max-new-tokens 64 --prompt $'<|begin_of_text|><|start_header_id|>system<|end_header_id|>"
                           "\\n\\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\\n\\nthe cat sat<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\\n\\n'\"", &plain)) << plain;
  EXPECT_NE(prompt_note(plain), "no note") << plain;
  EXPECT_EQ(prompt_note(chat), prompt_note(plain)) << "chat: " << chat << "\nplain: " << plain;
  EXPECT_NE(0, run_command(cli() + " generate " + root + "/run --chat --tokenizer byte --prompt x", &out));
  EXPECT_NE(out.find("generate --chat: the chat template's tokens need the model's tokenizer.json"), std::string::npos)
      << out;
  // A byte the tokenizer cannot read is blamed on the flag that holds it, at its offset there (the
  // rendered conversation's offset, and --prompt, were named for a byte of --system).
  for (const auto& [flags, said] : std::vector<std::pair<std::string, std::string>>{
           {"--chat --system $'ok\\xff' --prompt x", "--system: invalid UTF-8 at byte 2"},
           {"--chat --prompt $'abc\\xfe'", "--prompt: invalid UTF-8 at byte 3"},
           {"--prompt $'abc\\xfe'", "--prompt: invalid UTF-8 at byte 3"}}) {  // and without --chat, the same words
    EXPECT_EQ(1, run_command("bash -c \"" + cli() + " generate " + root + "/run " + flags + "\"", &out)) << flags;
    EXPECT_NE(out.find("error: generate: " + said + " (the tokenizer reads UTF-8 text)\n"), std::string::npos) << out;
  }
  // An empty --tokenizer (an unset shell variable) read as "none given"; prepare's as bytes.
  EXPECT_EQ(2, run_command(cli() + " generate " + root + "/run --tokenizer '' --prompt x", &out));
  EXPECT_NE(out.find("generate: --tokenizer is empty"), std::string::npos) << out;
  EXPECT_EQ(2, run_command(cli() + " prepare " + root + "/chats.jsonl --tokenizer '' -o " + root + "/none", &out));
  EXPECT_NE(out.find("prepare: --tokenizer is empty"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(root + "/none"));
  // Stop ids past every id the tokenizer has are never sampled: said, since the text then runs on.
  write_file(root + "/run/checkpoint-2/generation_config.json", R"({"eos_token_id": 300})");
  ASSERT_EQ(0, run_command(cli() + " generate " + root + "/run --tokenizer byte --prompt x --max-new-tokens 2", &out)) << out;
  EXPECT_NE(out.find("warning: no stop id of " + root + "/run/checkpoint-2 (300) is among the 257 ids of the tokenizer"),
            std::string::npos) << out;
  write_file(root + "/run/checkpoint-2/generation_config.json", R"({"eos_token_id": [300, 256]})");
  ASSERT_EQ(0, run_command(cli() + " generate " + root + "/run --tokenizer byte --prompt x --max-new-tokens 2", &out)) << out;
  EXPECT_EQ(out.find("warning: no stop id"), std::string::npos) << out;
}

// The reply ends at the format's end of turn even where the model's stop ids do not hold it (a base
// model's config names only <|end_of_text|>); a date pinned with --chat-date-string goes into the
// dated system turn, where the template writes one.
TEST_F(Training, GenerateChatStopsAtTheEndOfTurn) {
  std::string jsonl;
  for (int i = 0; i < 40; ++i)
    jsonl += R"({"messages": [{"role": "user", "content": "the cat sat"}, {"role": "assistant", "content": "on a mat"}]})" "\n";
  std::string config = llama3_chat_config(jsonl, 80);
  config.replace(config.find("  vocab_size"), 0, "  eos_token_id: 1\n");  // <|end_of_text|>
  std::string out;
  ASSERT_EQ(0, train(config, "run", "--set eval_steps=0 --set sequence_len=32", &out)) << out;
  ASSERT_EQ(0, run_command(cli() + " generate " + root + "/run --chat --prompt 'the cat sat' --temperature 0 "
                           "--max-new-tokens 20", &out)) << out;
  EXPECT_EQ(out, "on a mat\n");
  EXPECT_EQ(2, run_command(cli() + " generate " + root + "/run --chat --chat-date-string '' --prompt x", &out));
  EXPECT_NE(out.find("--chat-date-string is empty"), std::string::npos) << out;
  EXPECT_NE(0, run_command(cli() + " generate " + root + "/run --chat --chat-date-string '1 Feb 2031' --prompt x", &out));
  EXPECT_NE(out.find("--chat-date-string is for templates that write a date (llama3.1); the chat template of"),
            std::string::npos) << out;
  // Under a Llama-3.1-style template the pinned date is what the prompt holds: the same prompt length
  // (the note on a sample past the 64 positions says it) as that rendering given as a plain prompt.
  fs::copy_file(ingot::test::source_dir() + "/tests/fixtures/chat/llama31/tokenizer_config.json",
                root + "/run/checkpoint-80/tokenizer_config.json", fs::copy_options::overwrite_existing);
  std::string plain;
  ASSERT_EQ(0, run_command(cli() + " generate " + root + "/run --chat --chat-date-string '1 Feb 2031' --prompt 'the cat sat' "
                           "--temperature 0 --max-new-tokens 64", &out)) << out;
  ASSERT_EQ(0, run_command("bash -c \"" + cli() + " generate " + root + "/run --no-special-tokens --temperature 0 "
                           "--max-new-tokens 64 --prompt $'<|begin_of_text|><|start_header_id|>system<|end_header_id|>"
                           "\\n\\nCutting Knowledge Date: March 2025\\nToday Date: 1 Feb 2031\\n\\n<|eot_id|>"
                           "<|start_header_id|>user<|end_header_id|>\\n\\nthe cat sat<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\\n\\n'\"", &plain)) << plain;
  EXPECT_NE(prompt_note(plain), "no note") << plain;
  EXPECT_EQ(prompt_note(out), prompt_note(plain)) << "chat: " << out << "\nplain: " << plain;
}

// An evaluation whose batches hold no trained target (long prompts, masked) says why the step has
// no val_loss; it was left out without a word, at every evaluation.
TEST_F(Training, EvaluationWithoutTrainedTargetsIsNamed) {
  std::string jsonl, prompt;
  for (int i = 0; i < 60; ++i) prompt += "what is this ";
  for (int i = 0; i < 40; ++i)
    jsonl += "{\"messages\": [{\"role\": \"user\", \"content\": \"" + prompt +
             "\"}, {\"role\": \"assistant\", \"content\": \"ok\"}]}\n";
  const std::string config = llama3_chat_config(jsonl, 4);
  std::string out;
  ASSERT_EQ(0, train(config, "run", "--set eval_steps=2 --set eval_max_batches=1", &out)) << out;
  EXPECT_NE(out.find(" | no val_loss: no trained target in the 1 validation batch(es) evaluated (all masked or padding; "
                     "eval_max_batches 1, 0 evaluates them all)\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("val_loss "), std::string::npos) << out;
  // The data line says these conversations are longer than a row and train as separate pieces.
  EXPECT_NE(out.find("; 40 documents longer than 16 tokens (the longest "), std::string::npos) << out;
  EXPECT_NE(out.find(") split into pieces that do not attend to one another"), std::string::npos) << out;
}

// val_fraction takes the last documents: where those are long, validation holds far more of the
// tokens than the fraction says, and the data line says so.
TEST_F(Training, ValidationOfLongLastDocumentsIsNamed) {
  std::string jsonl, long_answer;
  for (int i = 0; i < 300; ++i) long_answer += "word ";
  for (int i = 0; i < 40; ++i)
    jsonl += "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"" +
             (i >= 38 ? long_answer : std::string("ok")) + "\"}]}\n";
  const std::string config = llama3_chat_config(jsonl, 1);
  std::string out;
  ASSERT_EQ(0, train(config, "run", "--set val_fraction=0.05 --set eval_steps=0", &out)) << out;
  EXPECT_NE(out.find("; the 2 val documents, the data's last, hold "), std::string::npos) << out;
  EXPECT_NE(out.find("% of its tokens (val_fraction counts documents)"), std::string::npos) << out;
  // Half the documents, the long ones among them: a share near the fraction, nothing to say.
  ASSERT_EQ(0, train(config, "run", "--overwrite --set val_fraction=0.5 --set eval_steps=0", &out)) << out;
  EXPECT_EQ(out.find("val_fraction counts documents"), std::string::npos) << out;
}

// generate on a folder without tokenizer.json reads and writes bytes: right for a byte-level model,
// garbage (without a word, it was) for one whose tokenizer files were not copied along.
TEST_F(Training, GenerateWarnsOfBytesForAModelOfAnotherVocabulary) {
  std::string out;
  ASSERT_EQ(0, run_command(cli() + " prepare " + root + "/text --tokenizer " + ingot::test::source_dir() +
                               "/tests/fixtures/chat/llama3_tokenizer -o " + root + "/bpe", &out)) << out;
  std::string config = tiny_config(root + "/bpe", root + "/run", 1, 0);
  config.replace(config.find("vocab_size: 257"), 15, "vocab_size: 515");
  ASSERT_EQ(0, train(config, "run", "--set eval_steps=0", &out)) << out;
  ASSERT_EQ(0, run_command(cli() + " export " + root + "/run " + root + "/hf", &out)) << out;
  // --overwrite replaces a companion file the export writes (beside ExportGenerateAndInfo, where
  // one it does not write stays).
  const std::string tokenizer = read_file(root + "/hf/tokenizer.json");
  write_file(root + "/hf/tokenizer.json", "an older tokenizer");
  ASSERT_EQ(0, run_command(cli() + " export " + root + "/run " + root + "/hf --overwrite", &out)) << out;
  EXPECT_EQ(read_file(root + "/hf/tokenizer.json"), tokenizer);
  // A BPE tokenizer reads UTF-8 only: a prompt that is not is named as the prompt.
  EXPECT_NE(0, run_command(cli() + " generate " + root + "/hf --prompt \"$(printf 'ab\\377')\" --max-new-tokens 2", &out));
  EXPECT_NE(out.find("generate: --prompt: invalid UTF-8 at byte 2 (the tokenizer reads UTF-8 text)"), std::string::npos) << out;
  fs::remove(root + "/hf/tokenizer.json");  // the weights copied without it
  ASSERT_EQ(0, run_command(cli() + " generate " + root + "/hf --prompt the --max-new-tokens 2", &out)) << out;
  EXPECT_NE(out.find("warning: " + root + "/hf has no tokenizer.json, so text is read and written as bytes "
                     "(ids 0-256), but the model's vocab_size is 515"), std::string::npos) << out;
  // Ingot's byte-level checkpoints, their vocabulary padded or not, are what bytes are for.
  for (const char* vocab : {"257", "320"}) {
    std::string bytes = tiny_config(data, root + "/bytes" + vocab, 1, 0);
    bytes.replace(bytes.find("vocab_size: 257"), 15, std::string("vocab_size: ") + vocab);
    ASSERT_EQ(0, train(bytes, std::string("bytes") + vocab, "--set eval_steps=0", &out)) << out;
    ASSERT_EQ(0, run_command(cli() + " generate " + root + "/bytes" + vocab + " --prompt the --max-new-tokens 2", &out)) << out;
    EXPECT_EQ(out.find("warning"), std::string::npos) << out;
    ASSERT_EQ(0, run_command(cli() + " export " + root + "/bytes" + vocab + " " + root + "/hf" + vocab, &out)) << out;
    ASSERT_EQ(0, run_command(cli() + " generate " + root + "/hf" + vocab + " --prompt the --max-new-tokens 2", &out)) << out;
    EXPECT_EQ(out.find("warning"), std::string::npos) << "an export of a byte-level model\n" << out;
  }
  // A tokenizer larger than the model's vocabulary is named by its file (it was "tokenizer bpe").
  const std::string larger = ingot::test::source_dir() + "/tests/fixtures/chat/llama3_tokenizer/tokenizer.json";
  EXPECT_NE(0, run_command(cli() + " generate " + root + "/hf257 --tokenizer " + larger + " --prompt the", &out));
  EXPECT_NE(out.find("error: tokenizer " + larger + " has 515 ids but the model's vocab_size is 257 (" + root +
                     "/hf257/config.json); give the model's own tokenizer with --tokenizer"), std::string::npos) << out;
}

// Checkpoints carry the tokenizer the run started with: the dataset's tokenizer.json was copied
// from disk at every save, so one replaced mid-run (prepare --overwrite with another tokenizer)
// went into every later checkpoint of weights trained on the old ids (a fuzzing review,
// 2026-12-02). The run is paused once its first checkpoint exists, the file replaced, the run
// resumed.
TEST_F(Training, CheckpointsKeepTheTokenizerTheRunStartedWith) {
  std::string out;
  ASSERT_EQ(0, run_command(cli() + " prepare " + root + "/text --tokenizer " + ingot::test::source_dir() +
                               "/tests/fixtures/chat/llama3_tokenizer -o " + root + "/bpe", &out)) << out;
  const std::string original = read_file(root + "/bpe/tokenizer.json");
  std::string config = tiny_config(root + "/bpe", root + "/run", 600, 100);
  config.replace(config.find("vocab_size: 257"), 15, "vocab_size: 515");
  config.replace(config.find("save_total_limit: 3"), 19, "save_total_limit: 0");
  write_file(root + "/run.yaml", config);
  // One thread: two spinning on a loaded 2-core CI machine made 2000 steps take 87 s.
  ASSERT_EQ(0, train_paused(root + "/run.yaml", "--set eval_steps=0 --set num_threads=1", root + "/run.log",
                            "[ -d " + root + "/run/checkpoint-100 ]",
                            "ls " + root + "/run > " + root + "/run.at_pause; printf '{\"model\": \"another tokenizer\"}' > " +
                                root + "/bpe/tokenizer.json"))
      << read_file(root + "/run.log");
  ASSERT_EQ(read_file(root + "/run.at_pause").find("checkpoint-600"), std::string::npos)
      << "the run ended before the pause: nothing was checked";
  int checkpoints = 0;
  for (int step = 100; step <= 600; step += 100) {
    const std::string file = root + "/run/checkpoint-" + std::to_string(step) + "/tokenizer.json";
    ASSERT_TRUE(fs::exists(file)) << file;
    EXPECT_EQ(read_file(file), original) << file;
    ++checkpoints;
  }
  EXPECT_EQ(checkpoints, 6);
  EXPECT_NE(read_file(root + "/bpe/tokenizer.json"), original) << "the swap happened";
}

// A save the file system refuses names the step, the reason and the newest checkpoint kept (it was
// a raw "filesystem error: cannot create directories"). output_dir is made immutable mid-run with
// chattr +i, which binds root too; the test skips where chattr cannot.
TEST_F(Training, ASaveTheFileSystemRefusesNamesWhatIsKept) {
  if (run_command("mkdir -p " + root + "/probe && chattr +i " + root + "/probe && chattr -i " + root + "/probe", nullptr) != 0)
    GTEST_SKIP() << "chattr +i is not available here";
  write_file(root + "/run.yaml", tiny_config(data, root + "/run", 100000, 100));  // ends at the frozen save
  // Frozen once the plot that follows the save is written: frozen between the two, the plot would be
  // refused instead of the next save.
  EXPECT_EQ(1, train_paused(root + "/run.yaml", "--set eval_steps=0", root + "/run.log",
                            "[ " + root + "/run/loss.svg -nt " + root + "/run/checkpoint-100 ]", "chattr +i " + root + "/run",
                            "chattr -i " + root + "/run"));
  const std::string log = read_file(root + "/run.log");
  EXPECT_NE(log.find("error: the checkpoint of step "), std::string::npos) << log;
  EXPECT_NE(log.find(" could not be saved in " + root + "/run: Operation not permitted ("), std::string::npos) << log;
  EXPECT_NE(log.find("; the newest checkpoint is " + root + "/run/checkpoint-"), std::string::npos) << log;
}

// A save that runs out of room (here a file-size limit, as a full disk would) names the step and the
// reason, and leaves no partial checkpoint; it ended with the writer's bare "cannot write".
TEST_F(Training, ASaveThatRunsOutOfRoomNamesTheStep) {
  std::string out;
  write_file(root + "/full.yaml", tiny_config(data, root + "/full", 2, 2));
  EXPECT_EQ(1, run_command("trap '' XFSZ; ulimit -f 8; " + cli() + " train " + root + "/full.yaml --set eval_steps=0", &out))
      << out;
  EXPECT_NE(out.find("error: the checkpoint of step 2 could not be saved in " + root + "/full: cannot write "),
            std::string::npos) << out;
  EXPECT_NE(out.find("File too large"), std::string::npos) << out;
  for (const auto& entry : fs::directory_iterator(root + "/full"))
    EXPECT_EQ(entry.path().filename().string().find("checkpoint-"), std::string::npos) << entry.path();
}

// The plot of a run killed while writing it (loss.svg.tmp-<pid>) is removed by the next run in that
// output_dir, with a note; each SIGKILL at that moment left one more.
TEST_F(Training, AHalfWrittenPlotOfAKilledRunIsRemoved) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 2, 2), "run", "--set eval_steps=0", &out)) << out;
  const std::string dead_pid = exited_pid();
  ASSERT_FALSE(dead_pid.empty());
  const std::string stale = root + "/run/loss.svg.tmp-" + dead_pid;
  write_file(stale, "<svg");
  write_file(root + "/run/loss.svg.tmp-x", "not a pid: not ours");
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 3, 2), "run", "--resume --set eval_steps=0", &out)) << out;
  EXPECT_NE(out.find("note: removed " + stale + ", the half-written plot of a run killed while writing it"),
            std::string::npos) << out;
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(root + "/run/loss.svg.tmp-x"));
}

void Training::run_chat_sft(const std::string& tokenizer, const std::string& model_type, int vocab) {
  SCOPED_TRACE(tokenizer);
  std::string jsonl;
  for (int i = 0; i < 40; ++i)
    jsonl += "{\"messages\": [{\"role\": \"user\", \"content\": \"What is " + std::to_string(i) + " plus " +
             std::to_string(i) + "?\"}, {\"role\": \"assistant\", \"content\": \"It is " + std::to_string(2 * i) + ".\"}]}\n";
  write_file(root + "/chats.jsonl", jsonl);
  std::string out;
  ASSERT_EQ(0, run_command(cli() + " prepare " + root + "/chats.jsonl --format chat --tokenizer " + tokenizer +
                               " -o " + root + "/chat-data --overwrite", &out)) << out;
  EXPECT_NE(out.find("masked"), std::string::npos) << out;
  std::string config = tiny_config(root + "/chat-data", root + "/sft", 3, 0);
  config.replace(config.find("model_type: llama"), 17, "model_type: " + model_type);
  config.replace(config.find("vocab_size: 257"), 15, "vocab_size: " + std::to_string(vocab));
  config.replace(config.find("sequence_len: 16"), 16, "sequence_len: 64");
  ASSERT_EQ(0, train(config, "sft", "--set eval_steps=0 --overwrite", &out)) << out;
  EXPECT_NE(out.find("packed"), std::string::npos) << out;
  EXPECT_NE(out.find("step 3/3"), std::string::npos) << out;
  // The loss is a mean over the targets the mask keeps: from weights that give every logit 0 it is
  // ln(vocab) exactly, where a divisor that counted the masked prompt positions gave far less.
  ASSERT_EQ(0, train(config + "init_std: 1.0e-8\n", "sft-uniform",
                     "--overwrite --set max_steps=1 --set eval_steps=1 --set output_dir=" + root + "/sft-uniform", &out))
      << out;
  const std::vector<nlohmann::json> uniform = metrics_records(root + "/sft-uniform/metrics.jsonl");
  ASSERT_EQ(uniform.size(), 1u);
  EXPECT_NEAR(uniform[0]["loss"].get<double>(), std::log(double(vocab)), 1e-6);  // per-target losses are f32
  EXPECT_NEAR(uniform[0]["val_loss"].get<double>(), std::log(double(vocab)), 1e-6);
  EXPECT_TRUE(fs::exists(root + "/sft/checkpoint-3/tokenizer.json"));  // carried along for generation
  // generate starts the prompt with the tokenizer's special prefix (Llama 3: <|begin_of_text|>), as
  // transformers' tokenizer(prompt) does: the count in the long-prompt warning includes it.
  std::string prompt;
  for (int i = 0; i < 80; ++i) prompt += i % 2 ? "b " : "a ";
  const auto bpe = ingot::data::BpeTokenizer::from_file(tokenizer);
  const size_t expected = bpe.special_prefix().size() + bpe.encode(prompt).size();
  ASSERT_EQ(0, run_command(cli() + " generate " + root + "/sft --prompt '" + prompt + "' --max-new-tokens 1 --temperature 0", &out)) << out;
  EXPECT_NE(out.find("warning: the prompt is " + std::to_string(expected) + " tokens"), std::string::npos) << out;
  if (model_type == "llama") EXPECT_EQ(bpe.special_prefix().size(), 1u);
  ASSERT_EQ(0, run_command(cli() + " generate " + root + "/sft --prompt '" + prompt +
                               "' --max-new-tokens 1 --temperature 0 --no-special-tokens", &out)) << out;
  EXPECT_NE(out.find("warning: the prompt is " + std::to_string(bpe.encode(prompt).size()) + " tokens"), std::string::npos) << out;
}

// Paths that the file system refuses to look at (here a name past NAME_MAX; unreadable folders
// when not root) are named with their setting and the system's reason. They ended the run as a
// bare "filesystem error", and a train_data file that is no shard did not name the config.
TEST_F(Training, UnusablePathsNameTheirSetting) {
  const std::string long_name(300, 'x');
  std::string out;
  EXPECT_NE(0, train(tiny_config(data, root + "/" + long_name, 2, 0), "long_out", "", &out));
  EXPECT_NE(out.find("long_out.yaml: cannot use output_dir " + root + "/" + long_name +
                     ": File name too long"), std::string::npos) << out;
  std::string config = tiny_config(data, root + "/run", 2, 0);
  config += "model: " + root + "/" + long_name + "\n";
  config.erase(config.find("model_config:"), config.find("train_data:") - config.find("model_config:"));
  EXPECT_NE(0, train(config, "long_model", "", &out));
  EXPECT_NE(out.find("cannot read model or checkpoint " + root + "/" + long_name + ": File name too long"),
            std::string::npos) << out;
  // A file that is no shard, named as train_data: the error says which setting listed it.
  EXPECT_NE(0, train(tiny_config(root + "/long_model.yaml", root + "/run", 2, 0), "not_a_shard", "", &out));
  EXPECT_EQ(out.find("error: " + root + "/not_a_shard.yaml: shard " + root + "/long_model.yaml: bad magic"), 0u) << out;
  EXPECT_FALSE(fs::exists(root + "/run"));
}

// A config file whose name is not UTF-8 (Latin-1 bytes) trains, saves and resumes: the first save
// failed after the training on a JSON library error naming no file ("invalid UTF-8 byte").
TEST_F(Training, ConfigNamedInLatin1SavesAndResumes) {
  std::string out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 2, 0), "caf\xe9", "", &out)) << out;
  const std::string state = read_file(root + "/run/checkpoint-2/trainer_state.json");
  EXPECT_NE(state.find("/caf\xef\xbf\xbd.yaml\",\n"), std::string::npos) << state;  // U+FFFD for the byte
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 3, 0), "caf\xe9", "--resume", &out)) << out;
  EXPECT_TRUE(fs::exists(root + "/run/checkpoint-3"));
}

// output_dir may not be the file system's root, the training data's folder or the model's (a review
// of 2026-12-02: each trained, writing checkpoints and metrics among the shards or the model's files).
TEST_F(Training, OutputDirIsARunsOwnFolder) {
  std::string out;
  EXPECT_NE(0, train(tiny_config(data, data, 2, 0), "into_data", "", &out));
  EXPECT_NE(out.find("into_data.yaml: output_dir " + data + " is the folder of the training data"), std::string::npos) << out;
  // With --resume, so that a regression stops at "no checkpoint to resume" rather than train into /.
  EXPECT_NE(0, train(tiny_config(data, "/", 2, 0), "into_root", "--resume", &out));
  EXPECT_NE(out.find("into_root.yaml: output_dir / is the file system's root"), std::string::npos) << out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/run", 2, 0), "run", "", &out)) << out;
  // A run made so before the check (here: its data copied into it afterwards) still resumes.
  fs::copy(data, root + "/run", fs::copy_options::recursive);
  ASSERT_EQ(0, train(tiny_config(root + "/run", root + "/run", 3, 0), "run", "--resume", &out)) << out;
  fs::copy(root + "/run/checkpoint-2", root + "/model");
  std::string config = tiny_config(data, root + "/model/", 2, 0);
  config.erase(config.find("model_config:"), config.find("train_data:") - config.find("model_config:"));
  config += "model: " + root + "/model\n";
  EXPECT_NE(0, train(config, "into_model", "", &out));
  EXPECT_NE(out.find("into_model.yaml: output_dir " + root + "/model/ is the folder of model " + root + "/model"),
            std::string::npos) << out;
  EXPECT_FALSE(fs::exists(data + "/metrics.jsonl"));
  EXPECT_FALSE(fs::exists(root + "/model/metrics.jsonl"));
  // Beside them, the same model trains.
  const std::string into_model = "output_dir: " + root + "/model/";
  config.replace(config.find(into_model), into_model.size(), "output_dir: " + root + "/tuned");
  EXPECT_EQ(0, train(config, "tuned", "", &out)) << out;
}

// A training split smaller than one step's rows is said: every step repeats the same rows (a review
// set val_fraction: 0.9999999999 and trained one window over and over without a word).
TEST_F(Training, WarnsWhenTheTrainingSplitIsSmallerThanAStep) {
  std::string out;
  std::string config = tiny_config(data, root + "/run", 2, 0);
  config.replace(config.find("val_fraction: 0.1"), 17, "val_fraction: 0.999");
  ASSERT_EQ(0, train(config, "tiny_split", "", &out)) << out;
  EXPECT_NE(out.find("warning: " + root + "/tiny_split.yaml: the training split holds 1 row, fewer than the 4 a step "
                     "reads (micro_batch_size x gradient_accumulation_steps): each step repeats them; lower val_fraction"),
            std::string::npos) << out;
  ASSERT_EQ(0, train(tiny_config(data, root + "/ok", 2, 0), "ok", "", &out)) << out;
  EXPECT_EQ(out.find("the training split holds"), std::string::npos) << out;
}

// Command-line numbers and switches (a fuzzing review of 2026-12-02): integers in another base or
// empty were read as something else ("010" as 8, "" as 0), --warmup near 2^63 overflowed into a
// median of no steps (a crash), and the --no-... switches aborted on "=x" and turned on at "=false".
TEST_F(Training, CommandLineNumbersAndSwitchesAreReadAsWritten) {
  const std::string fixture = ingot::test::source_dir() + "/tests/fixtures/llama";
  const std::string bench = cli() + " bench --model " + fixture + " --device cpu --seq 16 --micro-batch 1 --steps 1";
  std::string out;
  for (const std::string& bad : {" --seq 010", " --seq 0x10", " --warmup ''", " --steps -0x1"}) {
    EXPECT_NE(0, run_command(bench + bad, &out)) << bad;
    EXPECT_NE(out.find("must be a plain decimal integer (no leading 0, no base prefix)"), std::string::npos) << bad << out;
  }
  EXPECT_EQ(2, run_command(bench + " --warmup 9223372036854775807", &out));
  EXPECT_NE(out.find("--warmup: must lie in [0, 1073741824], got 9223372036854775807"), std::string::npos) << out;
  EXPECT_NE(0, run_command(bench + " --seq 99999999999999999999", &out));
  EXPECT_NE(out.find("is out of range"), std::string::npos) << out;
  EXPECT_NE(0, run_command(bench + " --no-cuda-graph=x", &out));
  EXPECT_EQ(out.find("terminate called"), std::string::npos) << out;
  EXPECT_NE(0, run_command(cli() + " generate " + fixture + " --temperature '' --max-new-tokens 1", &out));
  EXPECT_NE(out.find("--temperature: must be a finite number"), std::string::npos) << out;
  EXPECT_NE(0, run_command(cli() + " generate " + fixture + " --seed 010 --max-new-tokens 1", &out));
  // --no-master-weights=false keeps the master weights; the bare switch drops them.
  ASSERT_EQ(0, run_command(cli() + " info " + fixture + " --precision bf16 --no-master-weights=false", &out)) << out;
  EXPECT_EQ(out.find("master 0 B"), std::string::npos) << out;
  ASSERT_EQ(0, run_command(cli() + " info " + fixture + " --precision bf16 --no-master-weights", &out)) << out;
  EXPECT_NE(out.find("master 0 B"), std::string::npos) << out;
}
