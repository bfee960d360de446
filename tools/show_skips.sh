#!/usr/bin/env bash
# Prints why each test of the last ctest run in BUILD skipped: ctest --output-on-failure shows a
# skipped test's output (GoogleTest's GTEST_SKIP message) only under -V.
#   usage: tools/show_skips.sh BUILD
log="${1:?usage: tools/show_skips.sh BUILD}/Testing/Temporary/LastTest.log"
[ -f "$log" ] || exit 0
awk '/: Skipped$/ { getline reason; next }
     /^\[  SKIPPED \] [^ ]+ \(/ { print "skipped " $4 ": " reason; reason = "" }' "$log"
