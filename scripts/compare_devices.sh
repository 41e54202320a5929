#!/usr/bin/env bash
# scripts/compare_devices.sh FASHION_MNIST_BINARY: trains the MLP and LeNet-5 on the first 1024
# Fashion-MNIST images on the CPU and with --device cuda, from the same initial weights and
# batches, and requires the mean training loss within 1e-4 relative and the test accuracy
# within 0.5 points. Where no CUDA driver is installed the CUDA run uses the host emulator
# (EMBER_CUDA_EMULATE=1: the same generated kernels built by the host C++ compiler), and says so.
set -euo pipefail
bin=$1
if [ -z "${EMBER_CUDA_EMULATE:-}" ] && ! ldconfig -p 2>/dev/null | grep 'libcuda\.so\.1' >/dev/null; then
  echo "# NO GPU: the --device cuda runs use the host CUDA emulator; a GPU run is still needed"
  export EMBER_CUDA_EMULATE=1
fi
for model in mlp lenet; do
  want=$("$bin" --model "$model" --train-limit 1024 --json | tail -1)
  got=$("$bin" --model "$model" --train-limit 1024 --json --device cuda | tail -1)
  if ! awk -v a="$want" -v b="$got" -v rel=1e-4 -v acc=0.005 -f "$(dirname "$0")/runs_agree.awk"; then
    echo "not ok: $model --device cuda: $got, cpu $want"
    exit 1
  fi
  echo "ok: $model --device cuda: $got (cpu: $want)"
done
