// The training loop: plan memory, build the model and optimizer, then step until max_steps,
// logging, evaluating and checkpointing as the config says. Resuming continues bit for bit.
#pragma once
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>

#include "ingot/core/context.h"
#include "ingot/optim/adamw.h"
#include "ingot/train/train_config.h"

namespace ingot {

struct TrainOptions {
  bool resume = false;      // continue from the newest checkpoint in output_dir
  bool overwrite = false;   // replace a run already in output_dir
};

struct TrainResult {
  int64_t steps = 0;  // the step the run reached (with nothing to do: its checkpoint's)
  // Of this invocation's last step with a loss and its last evaluation; none when it had none.
  std::optional<double> final_loss, final_val_loss;
  int64_t final_loss_step = 0;  // the step final_loss is of (a later step may have had no targets)
  std::string checkpoint_dir;
  int stopped_by = 0;  // SIGINT or SIGTERM when one ended the run before max_steps or cut its last evaluation short (StopSignals)
};

TrainResult run_training(const TrainConfig& config, const TrainOptions& options, std::ostream& log);

// The optimizer's settings from the run's config: betas, epsilon, weight decay and what it applies
// to, clipping, and the seed of the stochastic rounding draws (the run's seed).
AdamWConfig adamw_config(const TrainConfig& config);

// A Context for the requested device ("auto" | "cpu" | "cuda"); owns CUDA state when used.
class DeviceContext {
 public:
  DeviceContext(const std::string& device, int64_t num_threads);
  ~DeviceContext();
  Context& get() { return ctx_; }
  std::string description() const;

 private:
  Context ctx_;
};

}  // namespace ingot
