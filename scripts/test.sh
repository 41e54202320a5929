#!/usr/bin/env bash
# scripts/test.sh: sets everything up, then runs the whole Criterion suite twice: optimised, and
# under AddressSanitizer + UndefinedBehaviorSanitizer. This is the README's test command and
# what .ci/run runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --asan

status=0
echo "== tests (optimised build) =="
meson test -C build --print-errorlogs || status=1
echo "== tests (address + undefined sanitizers) =="
meson test -C build-asan --print-errorlogs --timeout-multiplier 4 || status=1
echo "== fuzzers (libFuzzer, ASan + UBSan: 20000 inputs each over fuzz/corpus) =="
bash scripts/fuzz.sh --runs 20000 || status=1
exit $status
