#!/usr/bin/env bash
# tests/install_check.sh BUILD_DIR: installs the build into a scratch prefix (meson install
# --destdir), then builds a tiny program outside the source tree against the installed copy with
# nothing but `pkg-config --cflags --libs ember` and runs it, as a user of the library would
# (README.md, "Installing"). PKG_CONFIG_SYSROOT_DIR maps the .pc file's prefix into the scratch
# tree. A sanitizer build's library needs the sanitizer runtimes in the program too.
set -euo pipefail
build=$(cd "$1" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
meson install -C "$build" --no-rebuild --destdir "$tmp/root" --quiet >/dev/null
pc=$(find "$tmp/root" -name ember.pc -print -quit)
[ -n "$pc" ] || { echo "install_check: meson install put no ember.pc under $tmp/root"; exit 1; }
hdr=$(find "$tmp/root" -name ember.h -print -quit)
lib=$(find "$tmp/root" -name 'libember.so*' -print -quit)
[ -n "$hdr" ] && [ -n "$lib" ] || { echo "install_check: ember.h or libember.so missing from the install"; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR="$tmp/root"
flags=$(pkg-config --cflags --libs ember)
echo "pkg-config --cflags --libs ember: $flags"
extra=()
# ldd's output is read whole first: under pipefail, `ldd | grep -q` fails whenever grep exits on
# its first match before ldd has written the rest (SIGPIPE), and the sanitizer flags went missing.
deps=$(ldd "$lib")
if [[ $deps == *libasan* ]]; then extra=(-fsanitize=address,undefined); fi
mkdir "$tmp/app"
cat > "$tmp/app/main.c" <<'C'
#include <ember.h>
#include <stdio.h>
int main(void) {
  em_scope_begin();
  em_tensor *x = em_arange(EM_F32, 0, 6, 1);
  em_tensor *s = em_sum(em_mul(x, x), EM_AXES(0), false); /* 0+1+4+9+16+25 */
  double v = s ? em_item(s) : -1;
  em_scope_end();
  em_thread_cleanup();
  printf("installed ember: sum of squares = %g\n", v);
  return v == 55 && em_debug_live_tensors() == 0 ? 0 : 1;
}
C
# shellcheck disable=SC2086 # $flags is a list of words
${CC:-cc} -std=c11 "${extra[@]}" -o "$tmp/app/main" "$tmp/app/main.c" $flags
LD_LIBRARY_PATH="$(dirname "$lib")" "$tmp/app/main"
