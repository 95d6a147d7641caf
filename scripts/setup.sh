#!/usr/bin/env bash
# Idempotent setup for a fresh Debian machine: system tools, the kernel-headers link bcc needs,
# tracefs, and the project virtualenv. Safe to run again: each step checks before it acts.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
# binutils: c++filt. The prebuilt CO-RE object needs no package: profkit loads it itself.
APT_PACKAGES=(linux-perf bpfcc-tools python3-bpfcc linux-headers-amd64 binutils)
# The real consumers the tests hand profkit's outputs to: a browser, Go's pprof, speedscope,
# Prometheus (and its promtool) for `watch`'s metrics and alert rules, tmux for `top`'s screen;
# gcc brings Debian's libgomp1, a second shape of OpenMP runtime for the region probes.
# patchelf makes Debian sid's CPython 3.14/3.15 run here (scripts/fetch_cpython.sh).
# clang, bpftool and libbpf-dev (its bpf_helpers.h) build the CO-RE object again, to check it
# against its source.
TEST_APT_PACKAGES=(chromium gcc golang-go nodejs npm prometheus tmux clang bpftool libbpf-dev patchelf)
WITH_TEST_TOOLS=0
[ "${1:-}" = "--test" ] && WITH_TEST_TOOLS=1

say() { printf 'setup: %s\n' "$*"; }

install_debian_packages() {
  local wanted=("${APT_PACKAGES[@]}")
  [ "$WITH_TEST_TOOLS" = 1 ] && wanted+=("${TEST_APT_PACKAGES[@]}")
  if ! command -v apt-get >/dev/null 2>&1; then
    say "no apt-get here: install ${APT_PACKAGES[*]} by hand (profkit doctor says what is missing)"
    return
  fi
  if [ "$(id -u)" != 0 ]; then
    say "not root: skipping Debian packages (${APT_PACKAGES[*]})"
    return
  fi
  local missing=()
  for pkg in "${wanted[@]}"; do
    # A tool already on PATH (node, npm from another source) needs no Debian package.
    case "$pkg" in nodejs) command -v node >/dev/null && continue ;; npm) command -v npm >/dev/null && continue ;; esac
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# bcc compiles its programs against /lib/modules/$(uname -r)/build. When the running kernel has no
# headers package of its own, Debian's generic -amd64 headers work for tracepoints and uprobes,
# provided build/ points at the -amd64 tree and source/ at the matching -common tree.
link_kernel_headers() {
  [ "$(id -u)" = 0 ] || return 0
  local mod="/lib/modules/$(uname -r)"
  if [ -e "$mod/build/include" ] || [ -e /sys/kernel/kheaders.tar.xz ]; then
    return
  fi
  local amd64 common
  amd64=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1 || true)
  [ -n "$amd64" ] || { say "no /usr/src/linux-headers-*-amd64: bcc will not compile"; return; }
  common="${amd64%-amd64}-common"
  mkdir -p "$mod"
  ln -sfn "$amd64" "$mod/build"
  [ -d "$common" ] && ln -sfn "$common" "$mod/source"
  say "linked $mod/build -> $amd64"
}

mount_tracefs() {
  [ "$(id -u)" = 0 ] || return 0
  if [ ! -e /sys/kernel/tracing/uprobe_events ]; then
    mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || say "could not mount tracefs"
  fi
}

make_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  # Reinstall only when the project metadata changed since the last install.
  local stamp="$VENV/.profkit-installed"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    say "installing profkit[dev] into $VENV"
    # pip compiles what it installs on one core (torch alone is thousands of modules); here
    # the compile runs on every core after it (docs/results/test-suite.md).
    "$VENV/bin/pip" install -q --no-compile --disable-pip-version-check -e '.[dev]'
    local site
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    # (Some packages ship files that are not Python 3, which pip's compile skips too.)
    "$VENV/bin/python" -m compileall -q -j0 "$site" >/dev/null 2>&1 || true
    touch "$stamp"
  fi
  # An editable install leaves profkit's own modules uncompiled, and where bytecode is not
  # written (PYTHONDONTWRITEBYTECODE) every command would compile them again, as a wheel's
  # install would not: compiled here, each time, as stale files are recompiled only.
  "$VENV/bin/python" -m compileall -q profkit >/dev/null
}

install_speedscope() {
  [ "$WITH_TEST_TOOLS" = 1 ] || return 0
  command -v npm >/dev/null 2>&1 || { say "no npm: speedscope tests will skip"; return; }
  if [ ! -f .cache/node/node_modules/speedscope/package.json ]; then
    say "installing speedscope (npm) into .cache/node"
    mkdir -p .cache/node
    npm install --silent --no-audit --no-fund --prefix .cache/node speedscope@1 >/dev/null
  fi
}

install_new_pythons() {
  # CPython 3.14 and 3.15 as Debian builds them, for the walker's tests (scripts/fetch_cpython.sh).
  [ "$WITH_TEST_TOOLS" = 1 ] || return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    say "no root or apt-get: the CPython 3.14/3.15 tests will say what is missing"
    return
  fi
  say "CPython 3.14 and 3.15 (Debian sid) into .cache/cpython"
  bash scripts/fetch_cpython.sh .cache/cpython 3.14 3.15
}

install_debian_packages
link_kernel_headers
mount_tracefs
# The test interpreters unpack beside pip, which keeps one core busy (about 15 s saved); their
# output is printed after pip's, whole.
pythons_log=$(mktemp)
install_new_pythons >"$pythons_log" 2>&1 &
pythons=$!
trap 'kill "$pythons" 2>/dev/null || true; rm -f "$pythons_log"' EXIT
make_venv
install_speedscope
pythons_status=0
wait "$pythons" || pythons_status=$?
cat "$pythons_log"
[ "$pythons_status" = 0 ] || { say "fetching CPython 3.14/3.15 failed"; exit "$pythons_status"; }
say "ready"
