#!/usr/bin/env bash
# Builds .device-deps/ on this machine for a GPU machine that reaches no package registry: the
# Debian packages the CUDA build needs beyond the CUDA toolkit, unpacked with the shared
# device-deps.sh (its default list lacks PCRE2, which the tokenizer needs, so a build there stopped
# at cmake). Send the folder along and build with -DCMAKE_PREFIX_PATH=$PWD/.device-deps/usr, as
# tools/device_check.sh and the other device scripts do.
#   usage: bash tools/device_deps.sh [PATH_TO_SHARED_DEVICE_DEPS_SH]
set -euo pipefail
script=${1:-../shared/tools/device-deps.sh}
[ -f "$script" ] || { echo "error: $script not found (pass the path of device-deps.sh)" >&2; exit 2; }
bash "$script" .device-deps libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev libcli11-dev libfmt-dev libfmt9 \
  libgtest-dev libgmock-dev googletest libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
