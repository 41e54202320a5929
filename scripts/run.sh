#!/usr/bin/env bash
# scripts/run.sh: sets everything up and runs the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The main job: the MLP trained for one epoch on Fashion-MNIST, each whole training step
# (forward, backward, SGD update) compiled with em_compile()'s default backend, inductor (any
# option overrides; run ./build/fashion_mnist without --compile for eager).
./build/fashion_mnist --epochs 1 --compile --whole-step "$@"
