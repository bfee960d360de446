// The engine switches that come from the environment (docs/config.md, "Engine switches outside the
// config"). A misspelt value must stop the run with its name, not quietly select the default: an
// A/B run that measured the default twice looks like a result.
#pragma once
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "ingot/core/error.h"

namespace ingot {

// The value of NAME, or "" when it is unset or empty; any other value must be one of `accepted`.
inline std::string env_choice(const char* name, std::initializer_list<const char*> accepted) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return "";
  std::string choices;
  for (const char* choice : accepted) {
    if (std::string(value) == choice) return value;
    choices += std::string(choices.empty() ? "" : ", ") + choice;
  }
  fail(name, " must be one of ", choices, " (or unset), got \"", value, "\"");
}

// An on/off switch: 1 on; 0, empty or unset off.
inline bool env_flag(const char* name) { return env_choice(name, {"0", "1"}) == "1"; }

}  // namespace ingot
