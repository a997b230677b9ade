#!/usr/bin/env bash
# A Docker engine and the base images, through ../shared/ci/docker-up.sh, with a
# second try at what failed.
#
# A busy or freshly booted host can take longer than the shared script's minute
# to start dockerd, can leave a half-started daemon or stale pid files behind, or
# can lack the nf_tables kernel support that Debian's default iptables needs; a
# mirror can fail an install or an image once. After a failed first try this
# tries again what failed: the images, the install, or else the daemon. For the
# daemon it prints the end of its log (so CI shows why), clears what the failed
# start left, switches to legacy iptables when the log names iptables, and waits
# up to three minutes for a fresh one; the shared script then runs again, and
# with the engine up it only provides the images.
set -euo pipefail
cd "$(dirname "$0")/.."

TMP=${TMPDIR:-/tmp}
DAEMON_LOG=$TMP/dockerd.log
say() { printf '[docker-engine] %s\n' "$*" >&2; }

if bash ../shared/ci/docker-up.sh; then
  exit 0
fi

if docker info >/dev/null 2>&1; then
  say "the engine is up; the base images failed: trying them once more"
  exec bash ../shared/ci/docker-up.sh
fi
if ! command -v dockerd >/dev/null 2>&1; then
  say "no dockerd: its install failed; trying the install once more"
  exec bash ../shared/ci/docker-up.sh
fi

say "first try failed; the end of $DAEMON_LOG:"
tail -n 40 "$DAEMON_LOG" >&2 2>/dev/null || say "(no daemon log)"

say "stopping what the failed start left and clearing stale pid files"
pkill -x dockerd 2>/dev/null || true
pkill -f 'containerd --config /var/run/docker/containerd' 2>/dev/null || true
for _ in $(seq 1 20); do pgrep -x dockerd >/dev/null || break; sleep 1; done
rm -f /var/run/docker.pid /var/run/docker/containerd/containerd.pid

if grep -qi 'iptables' "$DAEMON_LOG" 2>/dev/null && command -v iptables-legacy >/dev/null 2>&1; then
  say "the daemon's log names iptables: switching to legacy iptables"
  update-alternatives --set iptables /usr/sbin/iptables-legacy >/dev/null
  update-alternatives --set ip6tables /usr/sbin/ip6tables-legacy >/dev/null 2>&1 || true
fi

say "starting dockerd again (log: $DAEMON_LOG), waiting up to 180 s"
setsid dockerd >"$DAEMON_LOG" 2>&1 </dev/null &
for _ in $(seq 1 180); do docker info >/dev/null 2>&1 && break; sleep 1; done
if ! docker info >/dev/null 2>&1; then
  say "dockerd did not come up on the second try either; the end of $DAEMON_LOG:"
  tail -n 40 "$DAEMON_LOG" >&2 || true
  exit 1
fi

bash ../shared/ci/docker-up.sh
