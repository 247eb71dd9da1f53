#!/bin/sh
# Installs the Debian packages of scripts/package on this machine with apt-get, checks where
# everything went, that the user and group exist, the unit is enabled, the daemon runs from
# its installed path, the library is found by pkg-config and CMake and Python finds its package
# and the torch backend without help; then removes them (the configuration stays), purges them
# (nothing of theirs stays but the user and group, as Debian policy has it).
#   debian_packages.sh DIR_WITH_DEBS SOURCE_DIR
# Needs root; exit 77 (skipped) without it.
set -eu
debs=$(cd "$1" && pwd)
source=$(cd "$2" && pwd)
packages="gradsync-tools python3-gradsync libgradsync-dev gradsyncd libgradsync0"
[ "$(id -u)" = 0 ] || { echo "skipped: installing packages needs root"; exit 77; }
export DEBIAN_FRONTEND=noninteractive
work=$(mktemp -d)
daemon=""
purge() { dpkg --purge $packages >/dev/null 2>&1 || true; }
stop_daemon() { [ -z "$daemon" ] || { kill "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; daemon=""; }; }
trap 'stop_daemon; purge; rm -rf "$work"' EXIT
fail() { echo "debian_packages: $*" >&2; exit 1; }

purge
apt-get install -y -qq "$debs"/*.deb >"$work/apt.log" 2>&1 || { cat "$work/apt.log"; fail "apt-get install failed"; }
for package in $packages; do
  dpkg-query -W -f='${Status}\n' "$package" | grep -q "install ok installed" || fail "$package not installed"
done
for file in /usr/bin/gradsyncd /usr/bin/gradsyncctl /usr/bin/gradsync-bench /usr/bin/gradsync-model \
    /usr/bin/gradsync-transport-bench \
    /usr/lib/systemd/system/gradsyncd.service /usr/lib/sysusers.d/gradsync.conf \
    /usr/lib/tmpfiles.d/gradsync.conf /etc/gradsync/gradsyncd.toml \
    /usr/share/gradsync/grafana/gradsync.json /usr/share/gradsync/prometheus.yml \
    /usr/include/gradsync/gradsync.h; do
  [ -e "$file" ] || fail "missing $file"
done
dpkg-query -W -f='${Conffiles}\n' gradsyncd | grep -q /etc/gradsync/gradsyncd.toml ||
  fail "/etc/gradsync/gradsyncd.toml is not a conffile"
getent passwd gradsync >/dev/null || fail "no gradsync user"
getent group gradsync >/dev/null || fail "no gradsync group"
ls /etc/systemd/system/*.wants/gradsyncd.service >/dev/null 2>&1 || fail "gradsyncd.service not enabled"
/usr/bin/gradsyncd --version
grep -q '^ExecStart=/usr/bin/gradsyncd --config /etc/gradsync/gradsyncd.toml' \
  /usr/lib/systemd/system/gradsyncd.service || fail "the unit does not run the installed daemon"
echo "pkg-config: gradsync $(env -u PKG_CONFIG_PATH pkg-config --modversion gradsync)"
# Programs built against libgradsync-dev both ways, run as the 2 ranks of a job on the
# installed daemon.
cmake -S "$source/tests/install/cmake_consumer" -B "$work/cmake" >/dev/null || fail "find_package(gradsync)"
cmake --build "$work/cmake" >/dev/null
# shellcheck disable=SC2046
cc -o "$work/pkgconfig_consumer" "$source/tests/install/consumer.c" \
  $(env -u PKG_CONFIG_PATH pkg-config --cflags --libs gradsync)
/usr/bin/gradsyncd --socket "$work/gradsyncd.sock" --metrics-listen "" --listen 127.0.0.1:0 \
  --log-level warn &
daemon=$!
for _ in $(seq 200); do [ -S "$work/gradsyncd.sock" ] && break; sleep 0.05; done
for program in "$work/cmake/consumer" "$work/pkgconfig_consumer"; do
  pids=""
  for rank in 0 1; do
    GRADSYNC_SOCKET="$work/gradsyncd.sock" GRADSYNC_JOB="installed-$(basename "$program")" \
      RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 "$program" &
    pids="$pids $!"
  done
  for pid in $pids; do wait "$pid" || fail "$program failed"; done
done
stop_daemon
(cd / && env -u PYTHONPATH -u GRADSYNC_LIBRARY /usr/bin/python3 -c "
import gradsync, gradsync.torch, gradsync._backend as backend
print('python:', gradsync.__file__)
assert gradsync.__file__.startswith('/usr/lib/python3/dist-packages/'), gradsync.__file__
if 'python3-torch' in open('/var/lib/dpkg/status').read():
    print('backend:', backend.load_extension().__file__)
") || fail "the installed Python package"

for package in $packages; do dpkg -L "$package"; done | sort -u >"$work/files"
apt-get remove -y -qq $packages >/dev/null 2>&1 || fail "apt-get remove failed"
[ -e /etc/gradsync/gradsyncd.toml ] || fail "removal took the configuration (only purge may)"
dpkg --purge $packages >/dev/null 2>&1 || fail "dpkg --purge failed"
left=""
while read -r path; do
  if [ -f "$path" ] || [ -L "$path" ]; then left="$left $path"; fi
done <"$work/files"
[ -z "$left" ] || fail "left behind after purge:$left"
[ ! -e /etc/gradsync ] || fail "/etc/gradsync left behind after purge"
[ ! -e /usr/lib/python3/dist-packages/gradsync ] || fail "the Python package's directory left behind"
echo "debian packages: installed, checked, removed and purged"
