#!/usr/bin/env bash
# Installs what `make bench` needs, if anything is missing; quick when all is there.
#
# - memcached, redis-server, redis-tools (redis-cli, redis-benchmark): through
#   scripts/install-test-deps.sh, which installs them for the test suite already (and stops the
#   daemons the Debian packages start); apt-get directly if that script is missing or fails.
# - fio (apt), the disk reference of `make bench-bigdata` (bench/bigdata.py).
# - matplotlib (for bench/throughput.svg) in the repo's ./.venv (.gitignored).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

have_tools() {
  command -v memcached >/dev/null 2>&1 &&
    command -v redis-server >/dev/null 2>&1 &&
    command -v redis-benchmark >/dev/null 2>&1 &&
    command -v redis-cli >/dev/null 2>&1
}

if ! have_tools; then
  if [ -x scripts/install-test-deps.sh ]; then
    ./scripts/install-test-deps.sh || echo "bench/deps.sh: scripts/install-test-deps.sh failed; trying apt-get" >&2
  fi
  if ! have_tools; then
    echo "installing (apt): memcached redis-server redis-tools"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq memcached redis-server redis-tools >/dev/null
  fi
  # The Debian packages may start their own daemons; the benchmark starts its own on free ports.
  if command -v systemctl >/dev/null 2>&1; then
    for svc in memcached redis-server; do
      if systemctl is-active --quiet "$svc" 2>/dev/null; then
        $SUDO systemctl stop "$svc" || true
      fi
    done
  fi
  have_tools || { echo "bench/deps.sh: memcached/redis-server/redis-benchmark still missing" >&2; exit 1; }
fi

if ! command -v fio >/dev/null 2>&1; then
  echo "installing (apt): fio"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq fio >/dev/null
  command -v fio >/dev/null 2>&1 || { echo "bench/deps.sh: fio still missing" >&2; exit 1; }
fi

VENV=.venv
if ! { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import matplotlib' >/dev/null 2>&1; }; then
  if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    rm -rf "$VENV"
    if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
      rm -rf "$VENV"
      $SUDO apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
      python3 -m venv "$VENV"
    fi
  fi
  echo "installing (pip into $VENV): matplotlib"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check matplotlib
  "$VENV/bin/python" -c 'import matplotlib' ||
    { echo "bench/deps.sh: $VENV lacks matplotlib after pip install" >&2; exit 1; }
fi
exit 0
