#!/usr/bin/env bash
# scripts/run.sh: sets everything up and runs the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
./build/hello "$@"
