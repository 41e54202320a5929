#!/usr/bin/env bash
# tests/alloc_fail.sh STEP SHIM: allocation failure inside the libraries under Ember is
# contained. tools/alloc_fail_step runs one MLP training step with the shim (tools/failmalloc.c)
# failing one allocation made from inside a chosen library (FAILMALLOC_CALLER), and must end
# with the step finished (0) or failed with an Ember error and later steps working (3):
#   - oneDNN: every allocation oneDNN makes in an eager step (its GEMMs): std::bad_alloc used to
#     escape dnnl_sgemm and abort the process (prims/dnnl_guard.cpp);
#   - libgomp: every allocation made with libgomp on the stack in an eager step: a parallel
#     region whose if-clause was false made libgomp allocate a one-thread team on every call,
#     and libgomp exit(1)s when that fails; since issue 23 Ember opens no OpenMP region (its
#     own pool runs its loops, prims/pool.c) and calls oneDNN single-threaded, and a warm step
#     makes no libgomp allocation at all (the loop then runs no case);
#   - LLVM: allocations spread over the first compiled call's LLVM work (EMBER_CACHE=0: the
#     JIT's creation, IR emission, passes, code generation, loading): bad_alloc and LLVM's
#     "out of memory" fatal error used to abort it; now the graph runs op by op
#     (inductor/llvm_guard.cpp).
# The full loop over every allocation is scripts/alloc_fail.sh.
set -u
step=$1
shim=$2
# AddressSanitizer must be the first library loaded and owns malloc: no shim can go before it
if ldd "$step" | grep -q libasan; then
  echo "skipped: alloc_fail_step is built with AddressSanitizer, which the malloc shim cannot precede"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export EMBER_CACHE_DIR=$tmp/kcache FAILMALLOC_QUIET=1 OMP_NUM_THREADS=2
bad=0

run() { # mode library n [env...]
  local mode=$1 lib=$2 n=$3
  shift 3
  (env LD_PRELOAD="$shim" FAILMALLOC_CALLER="$lib" "$@" "$step" "$mode" malloc "$n") >"$tmp/out" 2>&1
  local rc=$?
  case $rc in
    0 | 3) ;;
    *) echo "FAIL: $mode step, allocation $n inside $lib: exit status $rc"; tail -n 8 "$tmp/out"; bad=1 ;;
  esac
  echo "$mode $lib #$n: exit $rc, $(grep -m1 -E '^(error|verdict|fallback)' "$tmp/out")"
}

count() { # mode library [env...]
  local mode=$1 lib=$2
  shift 2
  env LD_PRELOAD="$shim" FAILMALLOC_CALLER="$lib" "$@" "$step" "$mode" malloc 0 2>/dev/null | awk '/^allocs/ {print $2}'
}

k=$(count eager libdnnl)
[ "${k:-0}" -gt 0 ] || { echo "FAIL: no allocation inside oneDNN was seen (is the shim preloaded?)"; exit 1; }
for ((n = 1; n <= k && n <= 8; n++)); do run eager libdnnl "$n"; done

k=$(count eager libgomp)
for ((n = 1; n <= ${k:-0} && n <= 8; n++)); do run eager libgomp "$n"; done

k=$(count first libLLVM EMBER_CACHE=0)
[ "${k:-0}" -gt 100 ] || { echo "FAIL: no LLVM compile was seen in the first compiled call"; exit 1; }
for n in 1 $((k / 7)) $((k / 2)) $((k * 19 / 20)) "$k"; do
  run first libLLVM "$n" EMBER_CACHE=0
done
exit $bad
