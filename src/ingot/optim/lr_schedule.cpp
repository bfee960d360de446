#include "ingot/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "ingot/core/error.h"

namespace ingot {

void validate_lr_schedule_type(const std::string& type) {
  if (type == "constant" || type == "linear" || type == "cosine" || type == "wsd") return;
  fail("unknown lr_scheduler_type \"", type, "\"; supported: constant, linear, cosine, wsd");
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return peak * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup_steps));
  if (type == "constant") return peak;
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  const double progress = std::clamp(static_cast<double>(step - warmup_steps) / span, 0.0, 1.0);
  double factor = 1.0;
  if (type == "linear") {
    factor = 1.0 - progress;
  } else if (type == "cosine") {
    factor = 0.5 * (1.0 + std::cos(M_PI * progress));
  } else if (type == "wsd") {
    // warm-up, stable at peak, then a linear decay over the last decay_ratio of all steps
    const double decay_steps = std::max(1.0, decay_ratio * static_cast<double>(total_steps));
    const double decay_start = static_cast<double>(total_steps) - decay_steps;
    factor = step < decay_start ? 1.0 : std::max(0.0, (static_cast<double>(total_steps) - step) / decay_steps);
  }
  return peak * (min_lr_ratio + (1.0 - min_lr_ratio) * factor);
}

}  // namespace ingot
