// Host <-> device transfers that never make the host wait on the GPU in the steady state.
// On CUDA the host side is page-locked memory and every copy is only enqueued; a slot is handed
// out again only after the copy that last used it has run (an event per slot). On the CPU the
// slots are plain memory and copies are memcpy.
#pragma once
#include <cstdint>
#include <vector>

#include "ingot/core/context.h"
#include "ingot/core/tensor.h"

namespace ingot {

// `slots` host buffers of `bytes` each, used in turn for copies to or from the device.
class HostRing {
 public:
  HostRing(Context& ctx, int64_t bytes, int slots = 2);
  ~HostRing();
  HostRing(const HostRing&) = delete;
  HostRing& operator=(const HostRing&) = delete;

  int slots() const { return static_cast<int>(events_.size()); }
  void* slot(int i) const;
  // Waits until the last copy that used slot i has run: its memory may then be rewritten, or
  // read after a download.
  void wait(int i);
  // Enqueue a copy between slot i (from its start) and the tensor, then mark the slot busy until
  // the stream has passed the copy.
  void upload(int i, Tensor dst);
  void download(int i, Tensor src);

 private:
  void mark_busy(int i);

  Context& ctx_;
  int64_t bytes_;
  char* host_ = nullptr;            // slots * bytes_
  std::vector<char> plain_;         // CPU backend
  std::vector<void*> events_;       // CUDA: one per slot
};

}  // namespace ingot
