#!/usr/bin/env bash
# scripts/fuzz.sh: builds the libFuzzer targets (fuzz/, clang, ASan + UBSan; build-fuzz/) and runs
# each over its seed corpus in fuzz/corpus/<target>, printing inputs run and crashes per target.
#   scripts/fuzz.sh --runs N      each target for N inputs (what scripts/test.sh does in CI)
#   scripts/fuzz.sh --seconds S   each target for S seconds (default 60), a longer campaign
# New inputs that add coverage go to build-fuzz/corpus/<target> (not the repository's seeds);
# a crashing input is saved as build-fuzz/crash-<target>-*, and the exit status is 1.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=-max_total_time=60
case "${1:-}" in
  --runs) mode=-runs=$2 ;;
  --seconds) mode=-max_total_time=$2 ;;
  "") ;;
  *) echo "usage: scripts/fuzz.sh [--runs N | --seconds S]"; exit 2 ;;
esac
bash scripts/setup.sh --fuzz >/dev/null
targets=(npy idx embr ir kcache)
ninja -C build-fuzz "${targets[@]/#/fuzz/fuzz_}" >/dev/null
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
status=0
printf '%-8s %12s %8s\n' target inputs crashes
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t"
  log="build-fuzz/fuzz_$t.log"
  # -malloc_limit_mb: a loader that allocates more than the input can justify is a finding
  if ./build-fuzz/fuzz/fuzz_$t "$mode" -rss_limit_mb=4096 -malloc_limit_mb=1024 -timeout=10 \
       -artifact_prefix="build-fuzz/crash-$t-" "build-fuzz/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1; then
    crashes=0
  else
    crashes=1
    status=1
  fi
  runs=$(grep -ao 'Done [0-9]* runs' "$log" | awk '{print $2}' | tail -1 || true)
  [ -z "$runs" ] && runs=$(grep -ao '^#[0-9]*' "$log" | tr -d '#' | tail -1 || true)
  printf '%-8s %12s %8s\n' "$t" "${runs:-?}" "$crashes"
  [ "$crashes" = 0 ] || { echo "fuzz: $t crashed; see $log"; grep -aE 'ERROR|SUMMARY|runtime error' "$log" | head -5; }
done
exit $status
