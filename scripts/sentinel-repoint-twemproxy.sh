#!/bin/sh
# Sentinel's client-reconfig-script for memcached-protocol clients behind twemproxy
# (nutcracker): points the proxy's one-server pool at the new primary's memcached port and
# restarts the proxy (twemproxy has no reload). In sentinel.conf:
#
#   sentinel client-reconfig-script <master-name> /path/to/sentinel-repoint-twemproxy.sh
#
# Sentinel runs it as
#   <master-name> <role> <state> <from-ip> <from-port> <to-ip> <to-port>
# (the ports are RESP ports), on every Sentinel, possibly at the same time: it takes a lock,
# and it changes and restarts nothing when the pool already names the new primary and the
# proxy runs. Exit 1 makes Sentinel run it again later; 0 is done.
#
# The pool's server line must end in " primary", e.g.  - 10.0.0.1:11211:1 primary
# (and the pool should have auto_eject_hosts: false). Settings, from the environment Sentinel
# was started with:
#   NUTCRACKER_CONF     the proxy's config file (default /etc/nutcracker/nutcracker.yml)
#   NUTCRACKER_RESTART  the command that restarts the proxy (default: systemctl restart
#                       nutcracker)
#   NUTCRACKER_RUNNING  a command that succeeds while the proxy runs (default: systemctl
#                       is-active --quiet nutcracker)
#   MEMKEEP_MC_PORT     the memcached port of every memkeep (default 11211), or
#   MEMKEEP_PORT_MAP    a file of "<resp-port> <memcached-port>" lines, when they differ
set -eu

if [ $# -ne 7 ]; then
    echo "usage: $0 <master-name> <role> <state> <from-ip> <from-port> <to-ip> <to-port>" >&2
    exit 1
fi
to_ip=$6
to_port=$7
conf=${NUTCRACKER_CONF:-/etc/nutcracker/nutcracker.yml}
restart=${NUTCRACKER_RESTART:-systemctl restart nutcracker}
running=${NUTCRACKER_RUNNING:-systemctl is-active --quiet nutcracker}

mc_port=${MEMKEEP_MC_PORT:-11211}
if [ -n "${MEMKEEP_PORT_MAP:-}" ]; then
    mc_port=$(awk -v p="$to_port" '$1 == p { print $2; exit }' "$MEMKEEP_PORT_MAP")
    if [ -z "$mc_port" ]; then
        echo "$0: no memcached port for RESP port $to_port in $MEMKEEP_PORT_MAP" >&2
        exit 1
    fi
fi

target="$to_ip:$mc_port:1 primary"
(
    flock 9
    if grep -q -- "- $target\$" "$conf" && sh -c "$running" 9>&-; then
        exit 0
    fi
    if ! grep -q -- "- .*:[0-9]*:1 primary\$" "$conf"; then
        echo "$0: no server line ending in ':1 primary' in $conf" >&2
        exit 1
    fi
    tmp="$conf.repoint.$$"
    sed "s/^\([[:space:]]*- \).*:[0-9]*:1 primary\$/\1$target/" "$conf" >"$tmp"
    mv "$tmp" "$conf"
    # Without the lock's descriptor: a proxy that daemonizes would hold the lock for life.
    sh -c "$restart" 9>&-
) 9>>"$conf.lock"
