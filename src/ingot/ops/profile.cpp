#include "ingot/ops/profile.h"

#include <chrono>

#ifdef INGOT_HAVE_CUDA
#include "ingot/ops/cuda/device.h"
#endif

namespace ingot::ops {

namespace {
bool g_enabled = false;
std::map<std::string, OpStats> g_stats;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
void synchronize(Context& ctx) {
#ifdef INGOT_HAVE_CUDA
  if (ctx.device == Device::cuda) cuda::synchronize(ctx.cuda);
#endif
}
}  // namespace

void set_profiling(bool enabled) { g_enabled = enabled; }
bool profiling_enabled() { return g_enabled; }
const std::map<std::string, OpStats>& profile_stats() { return g_stats; }
void reset_profile() { g_stats.clear(); }

ProfileScope::ProfileScope(Context& ctx, const char* op, double flops, double bytes)
    : op_(op), flops_(flops), bytes_(bytes) {
  if (!g_enabled) return;
  ctx_ = &ctx;
  synchronize(ctx);
  start_ns_ = now_ns();
}

ProfileScope::~ProfileScope() {
  if (!ctx_) return;
  synchronize(*ctx_);
  OpStats& s = g_stats[op_];
  s.calls += 1;
  s.ms += static_cast<double>(now_ns() - start_ns_) / 1e6;
  s.flops += flops_;
  s.bytes += bytes_;
}

}  // namespace ingot::ops
