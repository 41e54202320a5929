#!/usr/bin/env bash
# scripts/run.sh: sets everything up and runs the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The main job: the MLP trained eagerly for one epoch on Fashion-MNIST (any option overrides).
./build/fashion_mnist --epochs 1 "$@"
