#!/usr/bin/env bash
# scripts/alloc_fail.sh: the allocation-failure loop. For each way of running the MLP training
# step (tools/alloc_fail_step.c) and each allocator, count the allocations one step makes, then
# run the step once per failure point (every point, or every stride-th when there are more than
# MAX_POINTS) with that allocation failing, and sort the outcomes:
#   ok         the step finished (the failure was absorbed, e.g. a compile fell back to op by op)
#   contained  the step failed with an Ember error; later steps work; nothing left alive
#   wrong      the process lived but Ember misbehaved (no message, error and a result, a later
#              step failed, tensors leaked): exit statuses 4-7 of alloc_fail_step
#   killed     the process died below Ember; the cause is the library that received the NULL
#              (the failing call's backtrace from the shim) and how it died
#
#   scripts/alloc_fail.sh [build-dir] [MAX_POINTS]        (defaults: build, 400)
# Modes: eager; compiled (a replay, kernels compiled); first (the compiled step's first call:
# trace, aot, inductor) with EMBER_CACHE=0 (LLVM compiles) and with the disk cache warm.
# Allocators: ember (em_debug_fail_alloc: Ember's allocator) and malloc (LD_PRELOAD shim
# tools/failmalloc.c: every heap allocation of the process); ALLOC_FAIL_ALLOCATORS="malloc"
# runs one of them, ALLOC_FAIL_MODES="eager first-cold" some of the modes. ALLOC_FAIL_KEEP=dir
# keeps each run's output there. Prints one table row per (mode, allocator) and the killed causes.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
max=${2:-400}
step=$build/alloc_fail_step
shim=$(readlink -f "$build/libfailmalloc.so")
[ -x "$step" ] && [ -f "$shim" ] || { echo "alloc_fail: build $step and $build/libfailmalloc.so first" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
keep=${ALLOC_FAIL_KEEP:-}
[ -n "$keep" ] && mkdir -p "$keep"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export EMBER_CACHE_DIR=$tmp/kcache

# The library an address in a backtrace line belongs to.
lib_of() {
  case "$1" in
    *libdnnl*) echo oneDNN ;;
    *libLLVM*) echo LLVM ;;
    *libgomp*) echo libgomp ;;
    *libember* | *alloc_fail_step*) echo Ember ;;
    *libstdc++*) echo libstdc++ ;;
    *libopenblas*) echo OpenBLAS ;;
    *libsleef*) echo SLEEF ;;
    *libc.so* | *ld-linux*) echo libc ;;
    *) echo other ;;
  esac
}

# Who received the NULL: the first frame of the shim's backtrace outside the shim, libc and
# libstdc++ (operator new), or "libstdc++" when nothing else is on the stack.
receiver() {
  local f=$1 l who=""
  while IFS= read -r l; do
    case "$l" in *libfailmalloc*) continue ;; esac
    who=$(lib_of "$l")
    case "$who" in libc | libstdc++) continue ;; esac
    echo "$who"
    return
  done < <(sed -n '/^failmalloc: failing allocation/,/^failmalloc: end of backtrace/p' "$f" | sed '1d;$d')
  echo "${who:-unknown}"
}

# How the process died, from its exit status and its stderr.
how() {
  local rc=$1 f=$2
  if grep -q "LLVM ERROR" "$f"; then echo "LLVM fatal error"
  elif grep -q "terminate called" "$f"; then
    grep -q "bad_alloc" "$f" && echo "uncaught bad_alloc" || echo "uncaught C++ exception"
  elif grep -q "^libgomp:" "$f"; then echo "libgomp exit($((rc)))"
  elif [ "$rc" -gt 128 ]; then
    case $((rc - 128)) in 11) echo SIGSEGV ;; 6) echo SIGABRT ;; 7) echo SIGBUS ;; *) echo "signal $((rc - 128))" ;; esac
  else echo "exit($rc)"
  fi
}

printf '%-22s %7s %6s %6s %6s %9s %6s %6s\n' "mode/allocator" allocs stride tried ok contained wrong killed
causes=$tmp/causes
: >"$causes"
run_mode() { # label mode which env...
  local label=$1 mode=$2 which=$3
  shift 3
  local pre=()
  [ "$which" = malloc ] && pre=(env LD_PRELOAD="$shim" FAILMALLOC_QUIET=0 "$@") || pre=(env "$@")
  rm -rf "$EMBER_CACHE_DIR"
  # the warm-cache mode fills the disk cache with a first run
  case "$label" in *warm*) "${pre[@]}" "$step" "$mode" "$which" 0 >/dev/null 2>&1 ;; esac
  local total
  total=$("${pre[@]}" "$step" "$mode" "$which" 0 2>/dev/null | awk '/^allocs/ {print $2}')
  [ -n "$total" ] || { echo "alloc_fail: $label: the counting run failed" >&2; return; }
  local stride=$(((total + max - 1) / max))
  [ "$stride" -lt 1 ] && stride=1
  local ok=0 contained=0 wrong=0 killed=0 tried=0 n out rc
  for ((n = 1; n <= total; n += stride)); do
    out=$tmp/run.txt
    # in a subshell, so that bash's "Aborted" notice goes to the run's output, not the table
    ("${pre[@]}" "$step" "$mode" "$which" "$n"; exit $?) >"$out" 2>&1
    rc=$?
    tried=$((tried + 1))
    case $rc in
      0) ok=$((ok + 1)) ;;
      3) contained=$((contained + 1)) ;;
      4 | 5 | 6 | 7) wrong=$((wrong + 1))
         echo "$label|wrong: $(grep -m1 '^verdict' "$out" | cut -c1-100)|$n" >>"$causes" ;;
      *) killed=$((killed + 1))
         local who="Ember"
         [ "$which" = malloc ] && who=$(receiver "$out")
         echo "$label|$who: $(how "$rc" "$out")|$n" >>"$causes" ;;
    esac
    [ -n "$keep" ] && cp "$out" "$keep/${label//\//_}_$n.txt"
    # a killed eager step may have left its disk cache half written; each run starts clean
    case "$label" in *warm*) ;; *) rm -rf "$EMBER_CACHE_DIR" ;; esac
  done
  printf '%-22s %7d %6d %6d %6d %9d %6d %6d\n' "$label" "$total" "$stride" "$tried" "$ok" "$contained" "$wrong" "$killed"
}

modes=${ALLOC_FAIL_MODES:-eager compiled first-cold first-warm}
for which in ${ALLOC_FAIL_ALLOCATORS:-ember malloc}; do
  for m in $modes; do
    case $m in
      eager | compiled) run_mode "$m/$which" "$m" "$which" ;;
      first-cold) run_mode "$m/$which" first "$which" EMBER_CACHE=0 ;;
      first-warm) run_mode "$m/$which" first "$which" ;;
    esac
  done
done
echo
echo "killed and wrong, by mode and cause (the library that got the NULL: how the process died),"
echo "with the first failure point of each (alloc_fail_step MODE ALLOCATOR N reproduces it):"
awk -F'|' '{k = $1 "|" $2; if (!(k in first)) {first[k] = $3; order[++n] = k} count[k]++}
     END {for (i = 1; i <= n; i++) printf "%6d %s (e.g. N=%s)\n", count[order[i]], order[i], first[order[i]]}' "$causes"
