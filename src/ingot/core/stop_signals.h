// SIGINT (Ctrl-C) and SIGTERM (`kill`, a scheduler's preemption notice, `docker stop`) ask a
// training run to stop cleanly: the run finishes the step it is on, saves a checkpoint and exits
// with status 128 + the signal's number, so `--resume` continues where it stopped. A second signal
// of either kind ends the process at once. The handlers also make the
// signals work in a container where ingot runs as PID 1, which ignores signals left at their
// default action. A signal that was ignored when ingot started stays ignored.
#pragma once
#include <string_view>

namespace ingot {

// Installs the handlers for its lifetime, then restores the previous ones. `note` (a string that
// outlives it) is what the handler prints after "ingot: SIGTERM" when a signal arrives. One at a
// time: the handlers and the received signal are process-wide.
class StopSignals {
 public:
  static constexpr std::string_view kTrainingNote =
      ": stopping after the step in hand (and saving a checkpoint); a second signal stops at once";
  explicit StopSignals(std::string_view note = kTrainingNote);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The signal that asked the run to stop (SIGINT or SIGTERM), or 0.
  int received() const;
};

// "SIGINT", "SIGTERM", or "a signal".
const char* signal_name(int signal_number);

}  // namespace ingot
