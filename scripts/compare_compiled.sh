#!/usr/bin/env bash
# scripts/compare_compiled.sh FASHION_MNIST_BINARY: trains the MLP and LeNet-5 on the first 2048
# Fashion-MNIST images eagerly and through em_compile in three ways (forward compiled with backend
# eager; forward and an ahead-of-time backward with aot_eager; the whole step, forward, backward
# and SGD update, as one compiled function) and requires every loss curve to equal eager's to the
# last bit (losses are logged as hexadecimal floats). Then the default backend, inductor, on the
# forward and on the whole step: its reductions sum in another order and its exp, log and tanh
# run SLEEF's 16-lane functions (1 ULP), so it must give the mean training loss within 1e-3
# relative and the test accuracy within 1 point of eager's.
set -euo pipefail
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for model in mlp lenet; do
  "$bin" --model "$model" --train-limit 2048 --json --loss-log "$dir/eager.txt" > /dev/null
  for mode in "--backend eager" "--backend aot_eager" "--whole-step --backend aot_eager"; do
    # shellcheck disable=SC2086
    "$bin" --model "$model" --train-limit 2048 --json --compile $mode --loss-log "$dir/compiled.txt" > /dev/null
    if ! cmp -s "$dir/eager.txt" "$dir/compiled.txt"; then
      echo "not ok: $model --compile $mode: the loss curve differs from eager"
      diff "$dir/eager.txt" "$dir/compiled.txt" | head -5
      exit 1
    fi
    echo "ok: $model --compile $mode: $(wc -l < "$dir/compiled.txt") steps, losses identical to eager"
  done
  want=$("$bin" --model "$model" --train-limit 2048 --json | tail -1)
  for mode in "" "--whole-step"; do
    # shellcheck disable=SC2086
    got=$("$bin" --model "$model" --train-limit 2048 --json --compile $mode | tail -1)
    if ! awk -v a="$want" -v b="$got" -v rel=1e-3 -v acc=0.01 -f "$(dirname "$0")/runs_agree.awk"; then
      echo "not ok: $model --compile $mode (inductor): $got, eager $want"
      exit 1
    fi
    echo "ok: $model --compile $mode (inductor): $got"
  done
done
