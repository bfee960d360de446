#include "ingot/core/stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string_view>

namespace ingot {

namespace {

// lock-free, so the handler may write it (async-signal-safe).
std::atomic<int> g_received{0};
static_assert(std::atomic<int>::is_always_lock_free);

// What the handler says after "ingot: SIGTERM": set before the handlers go live.
std::string_view g_note;

struct sigaction g_previous_int, g_previous_term;
bool g_installed_int = false, g_installed_term = false;

void restore_previous() {
  if (g_installed_int) sigaction(SIGINT, &g_previous_int, nullptr);
  if (g_installed_term) sigaction(SIGTERM, &g_previous_term, nullptr);
}

// sigaction is async-signal-safe: after the first signal of either kind, the next one of either
// kind takes the action it had before (by default, ending the process).
// The note says at once that the signal arrived, which matters while a large model loads: the run
// stops only after that, before its first step. write(2) is async-signal-safe; printf is not.
void on_stop_signal(int signal_number) {
  int none = 0;
  g_received.compare_exchange_strong(none, signal_number);
  restore_previous();
  const std::string_view name = signal_name(signal_number);
  const int saved_errno = errno;  // the interrupted code may be about to read it
  for (const std::string_view part : {std::string_view("\ningot: "), name, g_note, std::string_view("\n")})
    [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, part.data(), part.size());
  errno = saved_errno;
}

// A signal ignored when ingot started (`nohup`, or SIGINT for a shell's background job) stays
// ignored: whoever started the run asked for that.
// *installed is set before the handler goes live, so that a signal in between restores previous.
void install(int signal_number, struct sigaction* previous, bool* installed) {
  *installed = false;
  sigaction(signal_number, nullptr, previous);
  if (previous->sa_handler == SIG_IGN) return;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);  // the other stop signal waits while the handler runs
  sigaddset(&action.sa_mask, SIGINT);
  sigaddset(&action.sa_mask, SIGTERM);
  // SA_RESTART: a read or write the signal interrupts resumes instead of failing with EINTR.
  action.sa_flags = SA_RESTART;
  *installed = true;
  if (sigaction(signal_number, &action, nullptr) != 0) *installed = false;
}

}  // namespace

StopSignals::StopSignals(std::string_view note) {
  g_note = note;
  g_received.store(0);
  install(SIGINT, &g_previous_int, &g_installed_int);
  install(SIGTERM, &g_previous_term, &g_installed_term);
}

StopSignals::~StopSignals() { restore_previous(); }

int StopSignals::received() const { return g_received.load(); }

const char* signal_name(int signal_number) {
  switch (signal_number) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    default: return "a signal";
  }
}

}  // namespace ingot
