#include "ingot/core/staging.h"

#include <cstring>

#include "ingot/core/error.h"
#ifdef INGOT_HAVE_CUDA
#include "ingot/ops/cuda/device.h"
#endif

namespace ingot {

HostRing::HostRing(Context& ctx, int64_t bytes, int slots) : ctx_(ctx), bytes_(bytes) {
  INGOT_CHECK(bytes >= 0 && slots >= 1, "HostRing: bad size ", bytes, " x ", slots);
  const int64_t total = bytes * slots;
#ifdef INGOT_HAVE_CUDA
  if (ctx.device == Device::cuda) {
    host_ = static_cast<char*>(cuda::host_alloc_pinned(total));
    try {
      for (int i = 0; i < slots; ++i) events_.push_back(cuda::event_create());
    } catch (...) {  // no destructor runs for a constructor that throws: free what it took
      for (void* e : events_) cuda::event_destroy(e);
      cuda::host_free_pinned(host_);
      throw;
    }
    return;
  }
#endif
  plain_.assign(static_cast<size_t>(total), 0);
  host_ = plain_.data();
  events_.assign(static_cast<size_t>(slots), nullptr);
}

HostRing::~HostRing() {
#ifdef INGOT_HAVE_CUDA
  if (ctx_.device == Device::cuda) {
    for (void* e : events_) {
      try {
        cuda::event_synchronize(e);
        cuda::event_destroy(e);
      } catch (...) {
      }
    }
    cuda::host_free_pinned(host_);
  }
#endif
}

void* HostRing::slot(int i) const {
  INGOT_CHECK(i >= 0 && i < slots(), "HostRing: slot ", i, " of ", slots());
  return host_ + i * bytes_;
}

void HostRing::wait(int i) {
  slot(i);
#ifdef INGOT_HAVE_CUDA
  if (ctx_.device == Device::cuda) cuda::event_synchronize(events_[i]);
#endif
}

void HostRing::mark_busy(int i) {
#ifdef INGOT_HAVE_CUDA
  if (ctx_.device == Device::cuda) cuda::event_record(events_[i], ctx_.cuda);
#else
  (void)i;
#endif
}

void HostRing::upload(int i, Tensor dst) {
  INGOT_CHECK(dst.bytes() <= bytes_, "HostRing::upload: ", dst.bytes(), " bytes exceed the slot's ", bytes_);
  if (dst.device == Device::cpu) {
    std::memcpy(dst.data, slot(i), static_cast<size_t>(dst.bytes()));
    return;
  }
#ifdef INGOT_HAVE_CUDA
  cuda::copy_to_device_async(dst.data, slot(i), dst.bytes(), ctx_.cuda);
  mark_busy(i);
#endif
}

void HostRing::download(int i, Tensor src) {
  INGOT_CHECK(src.bytes() <= bytes_, "HostRing::download: ", src.bytes(), " bytes exceed the slot's ", bytes_);
  if (src.device == Device::cpu) {
    std::memcpy(slot(i), src.data, static_cast<size_t>(src.bytes()));
    return;
  }
#ifdef INGOT_HAVE_CUDA
  cuda::copy_to_host_async(slot(i), src.data, src.bytes(), ctx_.cuda);
  mark_busy(i);
#endif
}

}  // namespace ingot
