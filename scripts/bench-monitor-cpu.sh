#!/usr/bin/env bash
# The idle monitor's own cost next to node_exporter's: both run side by side,
# each scraped every 15 s (as Prometheus' default job does), and the CPU time
# each used (user + system, /proc/PID/stat) over the run is printed per minute.
#   scripts/bench-monitor-cpu.sh [MINUTES]      (default 5)
# The monitor runs with the service's flags (packaging/pcieipc-monitor.service:
# --store, --metrics, --poll-ms 2000) and, once more, with the counters polled
# every 500 ms (the default at a terminal), both with the counters source on the
# dgx8 sysfs fixture, an 8-GPU server's 38 functions, 36 with AER counters: the
# machines this project runs on have neither tracefs nor AER counters of their
# own. node_exporter runs with its default collectors on this machine.
source "$(dirname "$0")/common.sh"
cd "$REPO_ROOT"
[ -f build/env.sh ] || die "nothing built yet: run 'make build' first"
source build/env.sh
command -v prometheus-node-exporter >/dev/null || die "prometheus-node-exporter is missing: scripts/setup-host.sh installs it"
minutes="${1:-5}"
[[ "$minutes" =~ ^[1-9][0-9]*$ ]] || die "usage: scripts/bench-monitor-cpu.sh [MINUTES]"

work="$(mktemp -d /tmp/pcieipc-bench-monitor.XXXXXX)"
started=()
cleanup() {
    local pid
    for pid in "${started[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${started[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_monitor POLL-MS: its pid in $monitor, its port in $monitor_port.
start_monitor() {
    monitor_port="$(free_port)"
    "$PCIEIPC_BIN/pcieipc" monitor --source counters --sysfs-root tests/fixtures/sysfs/dgx8 \
        --store "$work/events-$1.db" --metrics "127.0.0.1:$monitor_port" --poll-ms "$1" \
        >/dev/null 2>"$work/monitor-$1.err" &
    monitor=$!; started+=("$monitor")
}
start_monitor 2000; service=$monitor; service_port=$monitor_port
start_monitor 500; terminal=$monitor; terminal_port=$monitor_port
exporter_port="$(free_port)"
prometheus-node-exporter --web.listen-address="127.0.0.1:$exporter_port" >/dev/null 2>"$work/exporter.err" &
exporter=$!; started+=("$exporter")

scrape() { curl -sf "http://127.0.0.1:$1/metrics"; }
ports=("$service_port" "$terminal_port" "$exporter_port")
ready() { local port; for port in "${ports[@]}"; do scrape "$port" >/dev/null || return 1; done; }
for _ in $(seq 100); do ready && break; sleep 0.1; done
ready || { cat "$work"/*.err; die "a monitor or node_exporter did not answer"; }
monitor_page="$(scrape "$service_port" | wc -c)"
exporter_page="$(scrape "$exporter_port" | wc -c)"

# CPU time (user + system) of a process, in clock ticks.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz="$(getconf CLK_TCK)"
log "the two monitors and node_exporter started; measuring $minutes min, scraping each every 15 s"
service_before="$(ticks "$service")"; terminal_before="$(ticks "$terminal")"
exporter_before="$(ticks "$exporter")"
began="$(date +%s.%N)"
for _ in $(seq $((minutes * 4))); do
    sleep 15
    for port in "${ports[@]}"; do scrape "$port" >/dev/null || die "a scrape of 127.0.0.1:$port failed"; done
done
service_used=$(( $(ticks "$service") - service_before ))
terminal_used=$(( $(ticks "$terminal") - terminal_before ))
exporter_used=$(( $(ticks "$exporter") - exporter_before ))
elapsed="$(echo "$(date +%s.%N) - $began" | bc -l)"
per_minute() { echo "scale=1; $1 * 1000 / $hz * 60 / $elapsed" | bc -l; }
printf 'over %.0f s, %d scrapes each:\n' "$elapsed" $((minutes * 4))
printf '  pcieipc monitor, the service'"'"'s flags (counters every 2 s; page %d bytes): %s ms CPU per minute\n' \
    "$monitor_page" "$(per_minute "$service_used")"
printf '  pcieipc monitor, counters every 500 ms:                               %s ms CPU per minute\n' \
    "$(per_minute "$terminal_used")"
printf '  node_exporter, default collectors (page %d bytes):                    %s ms CPU per minute\n' \
    "$exporter_page" "$(per_minute "$exporter_used")"
