#!/usr/bin/env bash
# scripts/gpu-bundle: the folder it makes loads every library from itself but the C library's
# own, its daemon starts from there and serves a rank of host memory (and, through py/, a rank
# of the Python client), and its `run` either
# passes (a GPU) or says that no device is usable (exit 77, as every gpu test does here).
#   gpu_bundle_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
source=$2
dir="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$source/scripts/gpu-bundle" --build "$build" "$dir/bundle" >/dev/null
export LD_LIBRARY_PATH="$dir/bundle/lib" UCX_MODULE_DIR="$dir/bundle/lib/ucx"
outside="$(ldd "$dir"/bundle/bin/* | awk '/=> \// { print $3 }' | sort -u |
  grep -v "^$dir/bundle/lib/" | grep -Ev '/(libc|libm)\.so' || true)"
[[ -z "$outside" ]] || fail "libraries from outside the bundle: $outside"
grep -q "not found" < <(ldd "$dir"/bundle/bin/*) && fail "a library the bundle lacks"

# Its daemon and bench, one rank of host memory, checked.
"$dir/bundle/bin/gradsyncd" --socket "$dir/d.sock" --metrics-listen "" --listen "" --log-level warn &
for _ in $(seq 100); do [[ -S "$dir/d.sock" ]] && break; sleep 0.1; done
RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GRADSYNC_SOCKET="$dir/d.sock" \
  timeout 60 "$dir/bundle/bin/gradsync-bench" -b 4 -e 64K -f 16 -n 2 -w 1 --check >"$dir/bench.log" 2>&1 ||
  fail "the bundle's bench: $(cat "$dir/bench.log")"
"$dir/bundle/bin/gradsyncctl" --socket "$dir/d.sock" status >/dev/null || fail "gradsyncctl status"

# Its folder for the Python client: a rank of the Python package through it, the daemon behind
# its wrapper, Python with no library path but that folder's.
env LD_LIBRARY_PATH="$dir/bundle/py" /usr/bin/python3 "$source/tests/python/run_ranks.py" \
  --build-dir "$dir/bundle/py" --ranks 1 --worker api_worker.py >"$dir/python.log" 2>&1 ||
  fail "the bundle's Python client: $(tail -20 "$dir/python.log")"

# torch.distributed's backend built into that folder by scripts/build-torch-backend (as the
# checks build it against a GPU host's PyTorch), loaded from there, every call checked.
backend_status=0
"$source/scripts/build-torch-backend" /usr/bin/python3 "$dir/bundle/py/libgradsync.so" \
  >"$dir/backend_build.log" 2>&1 || backend_status=$?
if [[ $backend_status -eq 0 ]]; then
  found="$(env GRADSYNC_LIBRARY="$dir/bundle/py/libgradsync.so" PYTHONPATH="$source/client/python" \
    /usr/bin/python3 -c 'import gradsync.torch; print(gradsync.torch._backend.load_extension().__file__)')"
  [[ "$found" == "$dir/bundle/py/"* ]] || fail "the backend loaded from $found, not the bundle"
  env LD_LIBRARY_PATH="$dir/bundle/py" /usr/bin/python3 "$source/tests/python/run_ranks.py" \
    --build-dir "$dir/bundle/py" --ranks 2 --worker backend_worker.py --check calls \
    >"$dir/backend.log" 2>&1 || fail "the backend built by the script: $(tail -20 "$dir/backend.log")"
elif [[ $backend_status -ne 77 ]]; then
  fail "scripts/build-torch-backend: $(tail -20 "$dir/backend_build.log")"
fi

status=0
"$dir/bundle/run" "$dir/logs" >"$dir/run.log" 2>&1 || status=$?
if [[ $status -eq 77 ]]; then
  grep -q "no usable CUDA device" "$dir/run.log" || fail "exit 77 without saying why: $(cat "$dir/run.log")"
  echo "gpu bundle: built and loads from itself; no usable CUDA device here, its checks skipped"
  exit 0
fi
[[ $status -eq 0 ]] || fail "the bundle's checks: $(cat "$dir/run.log")"
cat "$dir/run.log"
