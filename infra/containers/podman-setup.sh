#!/usr/bin/env bash
# Podman for the containers mode of the tests and `tributary up --containers` (Linux, root or not):
# its configuration under one folder, the Docker-compatible API service on a socket, and an env
# file with the variables testcontainers and the image builder read. Idempotent: a running
# service is kept. `podman-setup.sh stop` stops the service this script started (by its PID).
#
# Traps this configuration avoids (measured on the project's machines, see ENVIRONMENT.md):
#  - crun's "setrlimit RLIMIT_NOFILE: Operation not permitted" -> default_ulimits;
#  - "cgroups in hybrid mode not supported" -> runc + cgroupfs + the file events logger;
#  - 20 s per run ("Exceeded conmon timeout") -> storage.conf with the overlay driver before first use;
#  - testcontainers' "KeyError: 'HostConfig'" on a host with /.dockerenv -> connection mode docker_host;
#  - no registry for Ryuk's image -> Ryuk disabled (the fixtures remove their containers by id).
set -euo pipefail
HOME_DIR="${TRIBUTARY_PODMAN_HOME:-${HOME}/.cache/tributary-podman}"
SOCK="$HOME_DIR/podman.sock"
PIDFILE="$HOME_DIR/service.pid"
ENVFILE="$HOME_DIR/env"

if [ "${1:-}" = "stop" ]; then
  if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    kill "$(cat "$PIDFILE")"; echo "podman service $(cat "$PIDFILE") stopped"
  fi
  rm -f "$PIDFILE"; exit 0
fi

if ! command -v podman >/dev/null; then
  echo "installing podman (Debian packages)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends podman runc \
    crun fuse-overlayfs slirp4netns uidmap debootstrap containernetworking-plugins catatonit iptables
fi

mkdir -p "$HOME_DIR/storage" "$HOME_DIR/run" "$HOME_DIR/tmp"
cat > "$HOME_DIR/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=16384:16384", "nproc=8192:8192"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$HOME_DIR/events.log"
tmp_dir = "$HOME_DIR/tmp"
CONF
cat > "$HOME_DIR/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$HOME_DIR/storage"
runroot = "$HOME_DIR/run"
CONF
cat > "$ENVFILE" <<CONF
export CONTAINERS_CONF=$HOME_DIR/containers.conf
export CONTAINERS_STORAGE_CONF=$HOME_DIR/storage.conf
export DOCKER_HOST=unix://$SOCK
export TESTCONTAINERS_RYUK_DISABLED=true
export TESTCONTAINERS_CONNECTION_MODE=docker_host
export TRIBUTARY_CONTAINER_ENGINE=podman
CONF
# shellcheck disable=SC1090
. "$ENVFILE"

if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null && [ -S "$SOCK" ]; then
  echo "podman service already running (pid $(cat "$PIDFILE"))"
else
  rm -f "$SOCK"
  nohup podman system service --time=0 "unix://$SOCK" >"$HOME_DIR/service.log" 2>&1 &
  echo $! > "$PIDFILE"
  for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
  [ -S "$SOCK" ] || { echo "podman service did not open $SOCK; see $HOME_DIR/service.log"; exit 1; }
  echo "podman service started (pid $(cat "$PIDFILE")) on $SOCK"
fi
echo "environment: $ENVFILE (the test fixtures and the image builder read it; or: . $ENVFILE)"
