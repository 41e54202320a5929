#!/usr/bin/env bash
# scripts/compare_compiled.sh FASHION_MNIST_BINARY: trains the MLP and LeNet-5 on the first 2048
# Fashion-MNIST images eagerly and through em_compile (backend eager) and requires the two loss
# curves to be identical to the last bit (losses are logged as hexadecimal floats).
set -euo pipefail
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for model in mlp lenet; do
  "$bin" --model "$model" --train-limit 2048 --json --loss-log "$dir/eager.txt" > /dev/null
  "$bin" --model "$model" --train-limit 2048 --json --compile --backend eager --loss-log "$dir/compiled.txt" > /dev/null
  if ! cmp -s "$dir/eager.txt" "$dir/compiled.txt"; then
    echo "not ok: $model: compiled loss curve differs from eager"
    diff "$dir/eager.txt" "$dir/compiled.txt" | head -5
    exit 1
  fi
  echo "ok: $model: $(wc -l < "$dir/compiled.txt") steps, compiled and eager losses identical"
done
