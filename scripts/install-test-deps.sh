#!/usr/bin/env bash
# Installs the programs the test suite talks to, if any is missing. Idempotent and quick when
# everything is already there. Debian/Ubuntu only (apt-get); runs apt-get through sudo when not root.
#
# - apt: memcached, libmemcached-tools (memccapable, memccp, memccat, memcstat, memcdump),
#   redis-server (RESP conformance), redis-sentinel (tests/failover.rs), redis-tools (redis-cli, redis-benchmark), nutcracker
#   (twemproxy, tests/twemproxy.rs), libspymemcached-java and a JDK (javac) for the spymemcached
#   client test (tests/memcached_clients.rs), sasl2-bin (saslpasswd2, so `make conformance` can
#   replay proto/binary/sasl.txt against memcached -S), strace (tests/fsync_order.rs), fuse3
#   (fusermount3, for the power-loss test's FUSE file system in tests/powerloss/; the fuser
#   crate mounts without libfuse, so no -dev package is needed), e2fsprogs (mkfs.ext4, for the
#   full disk of tests/disk_full.rs), tcl (tclsh, for Redis's own
#   test suite in `make redis-tests`).
# - apt: php-cli and php-redis (phpredis), ruby and ruby-redis (redis-rb), nodejs and npm when
#   node/npm are missing, for the client-library programs of tests/client_libs.rs.
# - npm: ioredis and redis (node-redis) into tests/client_programs/node/node_modules
#   (.gitignored), exactly as its package-lock.json pins them (`npm ci`); redone only when the
#   lock file changed since the last install.
# - apt: php-memcached and ruby-dalli (tests/memcached_clients.rs), openssl (tests/tls.rs).
# - a Python virtualenv at ./.venv (repo root, .gitignored) with the client libraries the client
#   tests drive: redis (redis-py), pymemcache, python-memcached, meta-memcache, from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
apt_updated=""
apt_install() {
  echo "installing (apt): $*"
  if [ -z "$apt_updated" ]; then
    $SUDO apt-get update -qq
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

need=()
command -v memcached >/dev/null 2>&1 || need+=(memcached)
command -v memccapable >/dev/null 2>&1 || need+=(libmemcached-tools)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
# Redis Sentinel drives memkeep's failover (tests/failover.rs).
command -v redis-sentinel >/dev/null 2>&1 || need+=(redis-sentinel)
{ command -v redis-cli >/dev/null 2>&1 && command -v redis-benchmark >/dev/null 2>&1; } ||
  need+=(redis-tools)
command -v saslpasswd2 >/dev/null 2>&1 || need+=(sasl2-bin)
# twemproxy in front of memkeep (tests/twemproxy.rs).
command -v nutcracker >/dev/null 2>&1 || need+=(nutcracker)
# The spymemcached (Java) client test compiles a small program with javac.
[ -f /usr/share/java/spymemcached.jar ] || need+=(libspymemcached-java)
{ command -v javac >/dev/null 2>&1 && command -v java >/dev/null 2>&1; } ||
  need+=(default-jdk-headless)
# The interactive redis-cli test drives a pty through python3's `pty` module.
command -v python3 >/dev/null 2>&1 || need+=(python3)
# Redis's own tcl test suite (make redis-tests, scripts/redis-tcl-suite.py) runs in tclsh.
command -v tclsh >/dev/null 2>&1 || need+=(tcl)
# tests/fsync_order.rs watches memkeep's system calls.
command -v strace >/dev/null 2>&1 || need+=(strace)
# tests/powerloss/ mounts a FUSE file system (it needs /dev/fuse too, which no package brings).
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
# tests/disk_full.rs makes a small ext4 file system in a file and loop-mounts it.
{ command -v mkfs.ext4 >/dev/null 2>&1 || [ -x /sbin/mkfs.ext4 ]; } || need+=(e2fsprogs)
# tests/tls.rs makes its certificates and checks handshakes with the openssl command.
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# Client libraries in other languages (tests/client_libs.rs).
command -v php >/dev/null 2>&1 || need+=(php-cli)
{ command -v php >/dev/null 2>&1 && php -r 'exit(extension_loaded("redis") ? 0 : 1);' 2>/dev/null; } ||
  need+=(php-redis)
command -v ruby >/dev/null 2>&1 || need+=(ruby)
{ command -v ruby >/dev/null 2>&1 && ruby -e 'require "redis"' 2>/dev/null; } || need+=(ruby-redis)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
# --- memcached client tests (php-memcached, dalli; tests/memcached_clients.rs) -------------
# PHP's Memcached extension (libmemcached underneath) for getAllKeys in text and binary modes,
# and Ruby's dalli. Debian packages; the php CLI and ruby come with them.
{ command -v php >/dev/null 2>&1 && php -r 'exit(class_exists("Memcached") ? 0 : 1);' >/dev/null 2>&1; } ||
  need+=(php-cli php-memcached)
{ command -v ruby >/dev/null 2>&1 && ruby -e 'require "dalli"' >/dev/null 2>&1; } ||
  need+=(ruby ruby-dalli)
# --- end of the memcached client tests' block ---------------------------------------------
if [ ${#need[@]} -gt 0 ]; then
  apt_install "${need[@]}"
fi

# ioredis and node-redis, as the lock file pins them. A copy of the lock file that was last
# installed is kept in node_modules; while it matches, nothing is fetched.
NODE_DIR=tests/client_programs/node
if ! cmp -s "$NODE_DIR/package-lock.json" "$NODE_DIR/node_modules/.memkeep-installed-lock.json"; then
  echo "installing (npm ci in $NODE_DIR): ioredis, redis"
  (cd "$NODE_DIR" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  cp "$NODE_DIR/package-lock.json" "$NODE_DIR/node_modules/.memkeep-installed-lock.json"
fi

# The Debian packages may start their own daemons; the tests start their own on free ports.
if command -v systemctl >/dev/null 2>&1; then
  for svc in memcached redis-server redis-sentinel nutcracker; do
    if systemctl is-active --quiet "$svc" 2>/dev/null; then
      systemctl stop "$svc" || true
    fi
  done
fi

# Python clients. `import memcache` is python-memcached; meta-memcache speaks only the meta
# protocol.
VENV=.venv
PY_PACKAGES=(redis pymemcache python-memcached meta-memcache)
venv_ok() {
  [ -x "$VENV/bin/python" ] &&
    "$VENV/bin/python" -c 'import redis, pymemcache, memcache, meta_memcache' >/dev/null 2>&1
}
if ! venv_ok; then
  if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    rm -rf "$VENV"
    if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
      # Debian's python3 ships venv (ensurepip) separately.
      rm -rf "$VENV"
      apt_install python3-venv
      python3 -m venv "$VENV" 2>/dev/null || { rm -rf "$VENV"; /usr/bin/python3 -m venv "$VENV"; }
    fi
  fi
  echo "installing (pip into $VENV): ${PY_PACKAGES[*]}"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
  venv_ok || { echo "install-test-deps: $VENV lacks ${PY_PACKAGES[*]} after pip install" >&2; exit 1; }
fi
exit 0
