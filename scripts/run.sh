#!/usr/bin/env bash
# scripts/run.sh: sets everything up and runs the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The main job: the MLP trained for one epoch on Fashion-MNIST, its forward pass and loss
# compiled with em_compile() (any option overrides; drop --compile for eager).
./build/fashion_mnist --epochs 1 --compile "$@"
