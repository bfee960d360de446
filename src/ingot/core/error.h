// Errors. Every user-facing failure throws ingot::Error with a message that names the file, key or
// value at fault; the CLI prints it and exits non-zero. INGOT_CHECK is for invariants the caller
// can break (bad shapes, bad input); internal bugs use assert.
#pragma once
#include <stdexcept>
#include <string>

#include <sstream>

namespace ingot {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A command line that parses but cannot run as given (a flag that does not apply, values that
// exceed a limit together): the CLI exits 2 for it, as for a line that does not parse.
struct UsageError : Error {
  using Error::Error;
};

// Throws E (Error or a kind of it) with the parts streamed into one message.
template <typename E, typename... Parts>
[[noreturn]] void fail_as(const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  throw E(message.str());
}

template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  fail_as<Error>(parts...);
}

}  // namespace ingot

#define INGOT_CHECK(condition, ...)                 \
  do {                                              \
    if (!(condition)) ::ingot::fail(__VA_ARGS__);   \
  } while (0)
