#!/usr/bin/env bash
# A private Docker engine for the smoke test, that leaves the host's network alone.
#
# $ tests/docker/dockerd.sh start     # prints `export DOCKER_HOST=...`; exit 3 if no engine can start
# $ tests/docker/dockerd.sh stop      # stops it by its PID (and waits for it to go)
# $ tests/docker/dockerd.sh status
#
# The engine has its own data root, exec root and socket, so it never meets a system Docker. It
# makes no bridge, no iptables rules, no forwarding and no masquerading (--bridge=none ...):
# builds use `--network host` (pip reaches the package registry the way the host does) and the
# containers run with host networking (docker-compose.ci.yml). It runs under `nice` so that image
# builds, which it forks, yield the CPU to a training run.
set -euo pipefail

STATE=${CAPSNET_CI_STATE:-/var/lib/capsnet-ci}     # images and build cache: kept between runs
RUN=${CAPSNET_CI_RUN:-/run/capsnet-ci}             # socket, pid, exec root: gone on reboot
SOCK=$RUN/docker.sock
PIDFILE=$RUN/dockerd.pid
LOG=$RUN/dockerd.log
NICE=${CAPSNET_CI_NICE:-15}

alive() { [[ -s $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

start() {
    command -v dockerd >/dev/null || { echo "no dockerd on PATH (apt-get install docker.io)" >&2; exit 3; }
    if alive; then
        echo "dockerd already running (pid $(cat "$PIDFILE")), reusing it" >&2
    else
        rm -f "$PIDFILE" "$SOCK"
        mkdir -p "$STATE/docker" "$RUN/exec"
        nohup nice -n "$NICE" dockerd \
            --data-root "$STATE/docker" --exec-root "$RUN/exec" \
            -H "unix://$SOCK" --pidfile "$PIDFILE" \
            --bridge=none --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
            >"$LOG" 2>&1 </dev/null &
        echo "$!" >"$RUN/dockerd.spawned"
    fi
    for _ in $(seq 60); do
        if DOCKER_HOST="unix://$SOCK" docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
            echo "export DOCKER_HOST=unix://$SOCK"
            return 0
        fi
        if ! kill -0 "$(cat "$RUN/dockerd.spawned" 2>/dev/null || echo 0)" 2>/dev/null && ! alive; then
            break  # it died
        fi
        sleep 1
    done
    echo "dockerd did not start; last lines of $LOG:" >&2
    tail -n 15 "$LOG" >&2 || true
    stop >/dev/null 2>&1 || true
    exit 3
}

stop() {
    local pid
    for f in "$PIDFILE" "$RUN/dockerd.spawned"; do
        [[ -s $f ]] || continue
        pid=$(cat "$f")
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid"
            for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
            if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; fi
            echo "dockerd (pid $pid) stopped"
        fi
        rm -f "$f"
    done
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) if alive; then echo "running, pid $(cat "$PIDFILE"), DOCKER_HOST=unix://$SOCK"; else echo "not running"; exit 1; fi ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
