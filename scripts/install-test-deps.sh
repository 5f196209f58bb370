#!/usr/bin/env bash
# Installs the programs the test suite talks to, if any is missing. Idempotent and quick when
# everything is already there. Debian/Ubuntu only (apt-get); runs apt-get through sudo when not root.
set -euo pipefail

need=()
command -v memcached >/dev/null 2>&1 || need+=(memcached)
command -v memccapable >/dev/null 2>&1 || need+=(libmemcached-tools)

if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
# The Debian packages may start their own daemons; the tests start their own on free ports.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet memcached 2>/dev/null; then
  systemctl stop memcached || true
fi
exit 0
