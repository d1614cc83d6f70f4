#!/usr/bin/env bash
# The idle monitor's own cost next to node_exporter's: both run side by side,
# each scraped every 15 s (as Prometheus' default job does), and the CPU time
# each used (user + system, /proc/PID/stat) over the run is printed per minute.
#   [BASELINE=OTHER/pcieipc] scripts/bench-monitor-cpu.sh [MINUTES]   (default 5)
# The monitor runs with the service's flags (packaging/pcieipc-monitor.service:
# --store, --metrics, --poll-ms 5000) and, once more, with the counters polled
# every 500 ms (the default at a terminal), and with the counters polled every
# 10 minutes (the scrapes' own cost: a monitor following tracefs, as the
# service does where the kernel has it, polls nothing), all with the counters source on the
# dgx8 sysfs fixture, an 8-GPU server's 38 functions, 36 with AER counters: the
# machines this project runs on have neither tracefs nor AER counters of their
# own. node_exporter runs with its default collectors on this machine.
# BASELINE: another build's pcieipc, run with the service's flags in the same
# run (a change's cost measured side by side, not against an earlier run).
# SYSFS_ROOT=/: the monitors read this machine's own sysfs instead of the
# fixture (a server's counters, read through sysfs as the service reads them).
source "$(dirname "$0")/common.sh"
cd "$REPO_ROOT"
[ -f build/env.sh ] || die "nothing built yet: run 'make build' first"
source build/env.sh
command -v prometheus-node-exporter >/dev/null || die "prometheus-node-exporter is missing: scripts/setup-host.sh installs it"
minutes="${1:-5}"
[[ "$minutes" =~ ^[1-9][0-9]*$ ]] || die "usage: scripts/bench-monitor-cpu.sh [MINUTES]"
[ -z "${BASELINE:-}" ] || [ -x "$BASELINE" ] || die "BASELINE=$BASELINE is not an executable pcieipc"

use_work_dir
names=(); pids=(); ports=()

# start NAME COMMAND...: COMMAND gets the port to listen on as its last argument.
start() {
    local name="$1" port; shift
    port="$(free_port)"
    "$@" "127.0.0.1:$port" >/dev/null 2>"$work/${#names[@]}.err" &
    started+=($!); names+=("$name"); pids+=($!); ports+=("$port")
}
monitor() {
    echo "$1" monitor --source counters --sysfs-root "${SYSFS_ROOT:-tests/fixtures/sysfs/dgx8}" \
        --store "$work/events-${#names[@]}.db" --poll-ms "$2" --metrics
}
start "pcieipc monitor, the service's flags (counters every 5 s)" $(monitor "$PCIEIPC_BIN/pcieipc" 5000)
start "pcieipc monitor, counters every 500 ms" $(monitor "$PCIEIPC_BIN/pcieipc" 500)
start "pcieipc monitor, scrapes only (counters every 10 min)" $(monitor "$PCIEIPC_BIN/pcieipc" 600000)
[ -z "${BASELINE:-}" ] ||
    start "BASELINE's monitor, the service's flags" $(monitor "$BASELINE" 5000)
start "node_exporter, default collectors" prometheus-node-exporter --web.listen-address

scrape() { curl -sf "http://127.0.0.1:$1/metrics"; }
ready() { local port; for port in "${ports[@]}"; do scrape "$port" >/dev/null || return 1; done; }
for _ in $(seq 100); do ready && break; sleep 0.1; done
ready || { cat "$work"/*.err; die "a monitor or node_exporter did not answer"; }
pages=()
for port in "${ports[@]}"; do pages+=("$(scrape "$port" | wc -c)"); done

# CPU time (user + system) of a process, in clock ticks.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz="$(getconf CLK_TCK)"
log "${#names[@]} exporters started; measuring $minutes min, scraping each every 15 s"
before=()
for pid in "${pids[@]}"; do before+=("$(ticks "$pid")"); done
began="$(date +%s.%N)"
for _ in $(seq $((minutes * 4))); do
    sleep 15
    for port in "${ports[@]}"; do scrape "$port" >/dev/null || die "a scrape of 127.0.0.1:$port failed"; done
done
elapsed="$(echo "$(date +%s.%N) - $began" | bc -l)"
printf 'over %.0f s, %d scrapes each (CPU per minute, page size):\n' "$elapsed" $((minutes * 4))
for i in "${!names[@]}"; do
    used=$(( $(ticks "${pids[$i]}") - before[i] ))
    printf '  %-58s %6.1f ms  %7d bytes\n' "${names[$i]}" \
        "$(echo "$used * 1000 / $hz * 60 / $elapsed" | bc -l)" "${pages[$i]}"
done
