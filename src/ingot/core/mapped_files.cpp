#include "ingot/core/mapped_files.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace ingot {

namespace {

// A fixed table, so the handler reads it without allocating or locking: a slot is live while its
// begin is nonzero, and begin is stored last (release), after end and path.
struct Slot {
  std::atomic<uintptr_t> begin{0};
  uintptr_t end = 0;
  char path[480] = {};
};
Slot g_slots[kMaxMappedFiles];
std::mutex g_slots_mutex;  // registration and removal only; never taken by the handler
std::once_flag g_handler_installed;
struct sigaction g_previous_sigbus;  // a handler installed before (a sanitizer's, a profiler's)

void write_text(const char* text) {
  size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, text, left);
    if (n <= 0) return;
    text += n;
    left -= static_cast<size_t>(n);
  }
}

void on_sigbus(int, siginfo_t* info, void*) {
  const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
  // si_addr is the faulting address only for a fault; `kill -BUS` (SI_USER) or sigqueue carry none.
  const bool fault = info->si_code > 0;
  for (const Slot& slot : g_slots) {
    if (!fault) break;
    const uintptr_t begin = slot.begin.load(std::memory_order_acquire);
    if (begin != 0 && address >= begin && address < slot.end) {
      write_text("error: ");
      write_text(slot.path);
      write_text(" changed on disk while ingot was reading it (truncated or overwritten in place: SIGBUS); "
                 "replace a file in use by writing a new one and renaming it over the old\n");
      ::_exit(1);
    }
  }
  // Not a registered mapping: whatever handled SIGBUS before takes it. A fault recurs when the
  // handler returns, and reaches that handler with its own information; a sent signal is sent again.
  sigaction(SIGBUS, &g_previous_sigbus, nullptr);
  if (!fault) raise(SIGBUS);
}

void install_handler() {
  struct sigaction action {};
  action.sa_sigaction = on_sigbus;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_SIGINFO;
  sigaction(SIGBUS, &action, &g_previous_sigbus);
}

}  // namespace

MappedFileRecord::MappedFileRecord(const void* begin, size_t bytes, const std::string& path) {
  std::call_once(g_handler_installed, install_handler);
  std::lock_guard<std::mutex> lock(g_slots_mutex);
  for (int i = 0; i < kMaxMappedFiles; ++i) {
    Slot& slot = g_slots[i];
    if (slot.begin.load(std::memory_order_relaxed) != 0) continue;
    slot.end = reinterpret_cast<uintptr_t>(begin) + bytes;
    const size_t n = std::min(path.size(), sizeof slot.path - 1);
    std::memcpy(slot.path, path.data(), n);
    slot.path[n] = '\0';
    slot.begin.store(reinterpret_cast<uintptr_t>(begin), std::memory_order_release);
    slot_ = i;
    return;
  }
}

MappedFileRecord::~MappedFileRecord() {
  if (slot_ >= 0) g_slots[slot_].begin.store(0, std::memory_order_release);
}

MappedFileRecord::MappedFileRecord(MappedFileRecord&& other) noexcept : slot_(other.slot_) { other.slot_ = -1; }

MappedFileRecord& MappedFileRecord::operator=(MappedFileRecord&& other) noexcept {
  if (this != &other) {
    if (slot_ >= 0) g_slots[slot_].begin.store(0, std::memory_order_release);
    slot_ = other.slot_;
    other.slot_ = -1;
  }
  return *this;
}

}  // namespace ingot
