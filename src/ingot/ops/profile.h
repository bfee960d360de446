// Op profiler: when enabled, every op dispatched through ops.h is timed (the device synchronised
// before and after, so the numbers are per-op wall time, not overlapped). Used by `ingot bench
// --profile` for the step breakdown in docs/perf.md; off by default, costing one branch per op.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "ingot/core/context.h"

namespace ingot::ops {

struct OpStats {
  int64_t calls = 0;
  double ms = 0;
  double flops = 0;   // counted for GEMMs and attention
  double bytes = 0;   // tensor bytes read + written, for memory-bound ops
};

void set_profiling(bool enabled);
bool profiling_enabled();
const std::map<std::string, OpStats>& profile_stats();
void reset_profile();

// RAII timer used by the dispatcher.
class ProfileScope {
 public:
  ProfileScope(Context& ctx, const char* op, double flops = 0, double bytes = 0);
  ~ProfileScope();

 private:
  Context* ctx_ = nullptr;
  const char* op_;
  double flops_, bytes_;
  int64_t start_ns_ = 0;
};

}  // namespace ingot::ops
