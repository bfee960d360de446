// Learning-rate schedules, as Hugging Face's get_*_schedule_with_warmup define them: the rate used
// by optimizer update number `step` (0-based) is peak * factor(step). Warm-up is linear from 0.
#pragma once
#include <cstdint>
#include <string>

namespace ingot {

struct LrSchedule {
  std::string type = "cosine";   // constant | linear | cosine | wsd
  double peak = 3e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.0;     // floor of linear/cosine/wsd decay, as a fraction of peak
  double decay_ratio = 0.1;      // wsd: the final fraction of steps spent decaying (linearly)

  double at(int64_t step) const;
};

void validate_lr_schedule_type(const std::string& type);  // error names the value and the choices

}  // namespace ingot
