#!/usr/bin/env bash
# scripts/setup.sh: installs what Ember needs from Debian (when missing), then configures and
# builds build/ (optimised) and, with --asan, build-asan/ (address + undefined sanitizers); with
# --fuzz, also clang and its libFuzzer runtime, and configures build-fuzz/ (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(meson ninja-build pkg-config gcc g++ llvm-19-dev libcriterion-dev libdnnl-dev
      libopenblas-dev libsleef-dev zlib1g-dev dataset-fashion-mnist fortunes
      libcjson-dev python3-numpy)
[ "${1:-}" = "--fuzz" ] && pkgs+=(clang libclang-rt-dev libomp-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

configure() { # dir, extra args...
  local dir=$1; shift
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" --native-file meson/native.ini "$@" >/dev/null
  fi
  meson compile -C "$dir" >/dev/null
}

configure build
if [ "${1:-}" = "--fuzz" ] && [ ! -f build-fuzz/build.ninja ]; then
  CC=clang CXX=clang++ meson setup build-fuzz --native-file meson/native.ini -Dfuzz=true -Dtests=disabled \
    -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug -Doptimization=1 >/dev/null
fi
if [ "${1:-}" = "--asan" ]; then
  configure build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug -Doptimization=1
fi
