#!/bin/sh
# Installs gradsync into a scratch prefix, builds tests/install/consumer.c against it twice (a
# CMake project through find_package(gradsync), and cc through pkg-config), and runs each as
# the 2 ranks of a job on a private daemon: both must get the allreduce right. Then the
# installed Python package must load the installed torch.distributed backend.
#   consumers.sh BUILD_DIR SOURCE_DIR
set -eu
build=$1
source=$2
# A library built with sanitizers needs their runtime first in every program that loads it:
# programs built outside the tree, as a user builds them, cannot load it.
if ldd "$build/libgradsync.so" | grep -q 'lib[a-z]*san\.so'; then
  echo "skipped: this libgradsync is instrumented with a sanitizer"
  exit 77
fi
dir=$(mktemp -d)
daemon=""
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT

cmake --install "$build" --prefix "$dir/prefix" >/dev/null
libdir=$(dirname "$(find "$dir/prefix" -name libgradsync.so | head -1)")

cmake -S "$source/tests/install/cmake_consumer" -B "$dir/cmake" \
  -DCMAKE_PREFIX_PATH="$dir/prefix" >"$dir/cmake.log" || { cat "$dir/cmake.log"; exit 1; }
grep "gradsync 0" "$dir/cmake.log"
cmake --build "$dir/cmake" >/dev/null

export PKG_CONFIG_PATH="$libdir/pkgconfig"
echo "pkg-config: $(pkg-config --modversion gradsync): $(pkg-config --cflags --libs gradsync)"
# shellcheck disable=SC2046
cc -o "$dir/pkgconfig_consumer" "$source/tests/install/consumer.c" \
  $(pkg-config --cflags --libs gradsync) -Wl,-rpath,"$libdir"

"$build/gradsyncd" --socket "$dir/gradsyncd.sock" --metrics-listen "" --listen 127.0.0.1:0 \
  --log-level warn &
daemon=$!
for _ in $(seq 200); do [ -S "$dir/gradsyncd.sock" ] && break; sleep 0.05; done

for program in "$dir/cmake/consumer" "$dir/pkgconfig_consumer"; do
  job="consumer-$$-$(basename "$program")"
  pids=""
  for rank in 0 1; do
    GRADSYNC_SOCKET="$dir/gradsyncd.sock" GRADSYNC_JOB="$job" RANK=$rank LOCAL_RANK=$rank \
      WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 "$program" &
    pids="$pids $!"
  done
  for pid in $pids; do wait "$pid"; done
done
echo "both consumers ran"

# The installed Python package loads the installed backend extension.
if ls "$build"/_torch_backend*.so >/dev/null 2>&1; then
  package=$(dirname "$(find "$dir/prefix" -path '*/gradsync/__init__.py' | head -1)")
  GRADSYNC_LIBRARY="$libdir/libgradsync.so" PYTHONPATH="$(dirname "$package")" /usr/bin/python3 -c "
import sys, gradsync.torch, gradsync._backend as backend
module = backend.load_extension()
print('backend extension:', module.__file__)
sys.exit(0 if module.__file__.startswith('$package') else 1)"
fi
