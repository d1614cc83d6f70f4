#!/usr/bin/env bash
# `pcieipc monitor --store --metrics` as a service, on a copy of the dgx8 sysfs
# fixture (GPU2/GPU3's switch uplink 0000:08:00.0 trained to x8 of x16; GPU6,
# 0000:8a:00.0, with AER counters this test raises), with the counters source:
#   - promtool accepts the page; a Prometheus server of its own (loopback, a
#     temporary directory, stopped at the end) scrapes it, and a PromQL query
#     over its HTTP API returns the degraded link;
#   - a counter raised between scrapes is the metric's increase and an event
#     in the store; `pcieipc events --summary` names the device;
#   - a monitor killed (SIGKILL) and started again keeps what was stored, adds
#     the errors counted while it was down, and stores nothing twice;
#   - bad input: a store that is not SQLite, a port in use, malformed
#     addresses, a read-only and a full file system: a clear error naming the
#     path or address, and the events stored before are all still there.
source "$(dirname "$0")/common.sh"
cd "$REPO_ROOT"
[ -f build/env.sh ] || die "nothing built yet: run 'make build' first"
source build/env.sh
for tool in prometheus promtool curl python3 unshare systemd-analyze; do
    command -v "$tool" >/dev/null || die "$tool is missing: scripts/setup-host.sh installs it"
done
pcieipc="$PCIEIPC_BIN/pcieipc"
GPU6=0000:8a:00.0
UPLINK=0000:08:00.0

use_work_dir

failures=0
check() {
    local name="$1"; shift
    if "$@"; then echo "ok: $name"; else echo "FAIL: $name"; failures=$((failures + 1)); fi
}

# wait_for SECONDS COMMAND...: until COMMAND succeeds.
wait_for() {
    local deadline=$(( $(date +%s) + $1 )); shift
    until "$@"; do [ "$(date +%s)" -lt "$deadline" ] || return 1; sleep 0.2; done
}

root="$work/root"
cp -a tests/fixtures/sysfs/dgx8 "$root"
gpu6_dir="$(dirname "$(find "$root/sys/devices" -path "*/$GPU6/aer_dev_correctable")")"
# set_gpu6 RXERR BADTLP: GPU6's correctable counters, written whole and renamed
# over the file so that no poll reads half of it.
set_gpu6() {
    printf 'RxErr %d\nBadTLP %d\nBadDLLP 1000\nRollover 0\nTimeout 0\nNonFatalErr 0\nCorrIntErr 0\nHeaderOF 0\nTOTAL_ERR_COR %d\n' \
        "$1" "$2" $(( $1 + $2 + 1000 )) >"$gpu6_dir/aer_dev_correctable.new"
    mv "$gpu6_dir/aer_dev_correctable.new" "$gpu6_dir/aer_dev_correctable"
}
store="$work/events.db"
metrics_port="$(free_port)"
monitor_args=(monitor --json --source counters --sysfs-root "$root" --poll-ms 100 --store "$store"
              --metrics "127.0.0.1:$metrics_port")
monitor_pid=
start_monitor() {
    : >"$work/monitor.err"
    "$pcieipc" "${monitor_args[@]}" >>"$work/monitor.out" 2>"$work/monitor.err" &
    monitor_pid=$!; started+=("$monitor_pid")
    wait_for 20 grep -q "following counters" "$work/monitor.err" ||
        { cat "$work/monitor.err"; die "the monitor did not start"; }
}
scrape() { curl -sf "http://127.0.0.1:$metrics_port/metrics"; }
# gpu6_metric ERROR: GPU6's pcieipc_aer_errors_total for that correctable error.
gpu6_metric() {
    scrape | grep '^pcieipc_aer_errors_total{' | grep -F "bdf=\"$GPU6\"" | grep -F "error=\"$1\"" |
        grep -F 'severity="correctable"' | awk '{print $NF}'
}
stored() { "$pcieipc" events --store "$store" --json; }

echo "--- the page"
start_monitor
scrape >"$work/page.txt"
check "promtool check metrics accepts the page" promtool check metrics <"$work/page.txt"
check "the page has the uplink degraded (x8 of x16)" grep -qF \
    "pcieipc_link_degraded{bdf=\"$UPLINK\",class=\"PCI bridge\",driver=\"pcieport\",gpu=\"\"} 1" "$work/page.txt"
check "GPU6's Bad TLP counter is the fixture's 9000" [ "$(gpu6_metric BadTLP)" = 9000 ]

echo "--- a Prometheus server scrapes it"
prometheus_port="$(free_port)"
cat >"$work/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: pcieipc
    static_configs:
      - targets: ['127.0.0.1:$metrics_port']
YAML
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
    --web.listen-address="127.0.0.1:$prometheus_port" >"$work/prometheus.log" 2>&1 &
started+=($!)
promql() { curl -sf "http://127.0.0.1:$prometheus_port/api/v1/query" --data-urlencode "query=$1"; }
# The bdf labels of a query's result.
result_bdfs() { promql "$1" 2>/dev/null | python3 -c 'import json, sys; print(" ".join(sorted(r["metric"].get("bdf", "") for r in json.load(sys.stdin)["data"]["result"])))' 2>/dev/null; }
degraded_links() { [ "$(result_bdfs 'pcieipc_link_degraded == 1')" = "$UPLINK" ]; }
check "PromQL 'pcieipc_link_degraded == 1' returns the uplink alone" wait_for 60 degraded_links ||
    { tail -20 "$work/prometheus.log"; promql 'up'; }

dashboard_queries() {
    python3 -c 'import json, sys
for panel in json.load(open(sys.argv[1]))["panels"]:
    for target in panel["targets"]:
        print(target["expr"])' packaging/grafana/pcieipc-dashboard.json
}
# Grafana's variables as a query of all servers, over a one-minute interval, has them.
dashboard_queries_run() {
    local expr
    while read -r expr; do
        expr="${expr//\$instance/.*}"; expr="${expr//\$__rate_interval/1m}"
        promql "$expr" | grep -q '"status":"success"' || { echo "rejected: $expr"; return 1; }
    done < <(dashboard_queries)
}
check "Prometheus accepts every query of the Grafana dashboard" dashboard_queries_run
check "the dashboard's degraded-links query returns the uplink" \
    [ "$(result_bdfs "$(dashboard_queries | grep -m1 '^pcieipc_link_degraded' | sed 's/\$instance/.*/')")" = "$UPLINK" ]

echo "--- a counter raised between scrapes"
set_gpu6 80000 9005
increase_seen() {
    local query="max_over_time(pcieipc_aer_errors_total{bdf=\"$GPU6\",error=\"BadTLP\"}[5m]) - min_over_time(pcieipc_aer_errors_total{bdf=\"$GPU6\",error=\"BadTLP\"}[5m])"
    [ "$(promql "$query" | python3 -c 'import json, sys; r = json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "none")')" = 5 ]
}
bad_tlp_is_9005() { [ "$(gpu6_metric BadTLP)" = 9005 ]; }
check "the next scrape shows 9005" wait_for 10 bad_tlp_is_9005
check "Prometheus sees the counter's increase of 5" wait_for 30 increase_seen
one_event() { [ "$(stored | grep -c .)" = 1 ]; }
check "the store holds one event" wait_for 10 one_event
check "it is GPU6's: counters, BadTLP, 5 occurrences, class and driver" grep -q \
    "\"bdf\":\"$GPU6\",\"boot_id\":\"[0-9a-f-]*\",\"class\":\"3D controller\",\"driver\":\"nvidia\",\"errors\":\[{\"bit\":6,\"masked\":false,\"name\":\"Bad TLP\",\"severity\":\"correctable\",\"short\":\"BadTLP\"}\],\"kind\":\"aer\",\"occurrences\":5" \
    <(stored)
check "the monitor printed the event it stored" grep -q "\"bdf\":\"$GPU6\".*\"occurrences\":5,\"source\":\"counters\"" "$work/monitor.out"
"$pcieipc" events --store "$store" --summary | tee "$work/summary.txt"
check "events --summary names GPU6 with one Bad TLP report" grep -qE \
    "^  $GPU6  3D controller +nvidia +correctable +BadTLP +1$" "$work/summary.txt"
check "events --device selects it; another device has none" sh -c \
    "[ \"\$('$pcieipc' events --store '$store' --device 8a:00.0 | grep -c .)\" = 1 ] && [ -z \"\$('$pcieipc' events --store '$store' --device 05:00.0)\" ]"
check "events --since 1h has it, a time after it not" sh -c \
    "[ \"\$('$pcieipc' events --store '$store' --since 1h | grep -c .)\" = 1 ] && [ -z \"\$('$pcieipc' events --store '$store' --since 2099-01-01T00:00:00Z)\" ]"
stored >"$work/before-kill.jsonl"

echo "--- killed, errors counted while it is down, started again"
kill -KILL "$monitor_pid"; wait "$monitor_pid" 2>/dev/null || true
set_gpu6 80002 9005
start_monitor
two_events() { [ "$(stored | grep -c .)" = 2 ]; }
check "the two Receiver Errors counted while it was down are one new event" wait_for 10 two_events
check "the first event is kept as it was" [ "$(stored | head -1)" = "$(cat "$work/before-kill.jsonl")" ]
check "the new one: RxErr, 2 occurrences" sh -c \
    "'$pcieipc' events --store '$store' --json | tail -1 | grep -q '\"short\":\"RxErr\"}\],\"kind\":\"aer\",\"occurrences\":2'"
kill -KILL "$monitor_pid"; wait "$monitor_pid" 2>/dev/null || true
start_monitor
sleep 1
check "killed and started once more, with no new errors: still two events" two_events
kill -TERM "$monitor_pid"
check "SIGTERM ends it with status 0" wait "$monitor_pid"
stored >"$work/kept.jsonl"
kept_events() { [ "$(stored)" = "$(cat "$work/kept.jsonl")" ]; }

echo "--- the systemd unit"
sed "s#/usr/bin/pcieipc#$pcieipc#" packaging/pcieipc-monitor.service >"$work/pcieipc-monitor.service"
check "systemd-analyze verify finds nothing to say" \
    sh -c "[ -z \"\$(systemd-analyze verify '$work/pcieipc-monitor.service' 2>&1)\" ]"
systemd-analyze security --offline=yes "$work/pcieipc-monitor.service" 2>&1 | tail -1 | tee "$work/exposure.txt"
exposure="$(grep -oE 'Overall exposure level for [^:]+: [0-9.]+' "$work/exposure.txt" | awk '{print $NF}')"
check "its exposure (systemd-analyze security) is 2.0 or lower: ${exposure:-none}" \
    awk -v exposure="$exposure" 'BEGIN { exit !(exposure != "" && exposure <= 2.0) }'

echo "--- bad input"
printf 'these are notes, not a database\n%.0s' {1..40} >"$work/notes.txt"
cp "$work/notes.txt" "$work/notes.orig"
# fails_with MESSAGE COMMAND...: exits 2, and stderr says MESSAGE.
fails_with() {
    local message="$1" rc=0; shift
    "$@" >/dev/null 2>"$work/error.txt" || rc=$?
    cat "$work/error.txt"
    [ "$rc" = 2 ] && grep -qF -- "$message" "$work/error.txt"
}
check "a store that is not SQLite: the monitor names it" fails_with \
    "$work/notes.txt: not an SQLite database" \
    "$pcieipc" monitor --source counters --sysfs-root "$root" --store "$work/notes.txt" --seconds 1
check "... and pcieipc events too" fails_with "$work/notes.txt: not an SQLite database" \
    "$pcieipc" events --store "$work/notes.txt"
check "... and the file is left as it was" cmp -s "$work/notes.txt" "$work/notes.orig"
check "a port in use: named" fails_with \
    "--metrics 127.0.0.1:$prometheus_port: cannot listen there: Address already in use" \
    "$pcieipc" "${monitor_args[@]/127.0.0.1:$metrics_port/127.0.0.1:$prometheus_port}"
check "an address without a port: named" fails_with \
    "--metrics localhost: not an address and port like 127.0.0.1:9773" \
    "$pcieipc" monitor --source counters --sysfs-root "$root" --metrics localhost
check "a port out of range: named" fails_with "--metrics 127.0.0.1:99999: not an address and port" \
    "$pcieipc" monitor --source counters --sysfs-root "$root" --metrics 127.0.0.1:99999
check "the store still holds its two events" kept_events

# A small file system of our own, in a mount namespace of our own (gone when
# the namespace ends): read-only, then full.
small="$work/small"
mkdir "$small"
export pcieipc root small work store GPU6 gpu6_dir
export -f set_gpu6 wait_for
unshare -m bash -euo pipefail -c '
    mount -t tmpfs -o size=512k tmpfs "$small"
    cp "$store" "$small/events.db"
    mount -o remount,ro "$small"
    rc=0
    "$pcieipc" monitor --source counters --sysfs-root "$root" --store "$small/events.db" --seconds 1 \
        >/dev/null 2>"$work/readonly.err" || rc=$?
    echo "read-only: exit $rc: $(cat "$work/readonly.err")"
    [ "$rc" = 2 ]
    grep -qF "$small/events.db: cannot write there" "$work/readonly.err"
    [ "$("$pcieipc" events --store "$small/events.db" | grep -c .)" = 2 ]
    echo "ok: a read-only store: named, and its two events still read"

    mount -o remount,rw "$small"
    "$pcieipc" monitor --source counters --sysfs-root "$root" --poll-ms 100 --store "$small/events.db" \
        >/dev/null 2>"$work/full.err" &
    monitor=$!
    wait_for 20 grep -q "following counters" "$work/full.err"
    dd if=/dev/zero of="$small/filler" bs=4k 2>/dev/null || true
    set_gpu6 80010 9005
    rc=0; wait "$monitor" || rc=$?
    echo "full: exit $rc: $(tail -1 "$work/full.err")"
    [ "$rc" = 2 ]
    grep -qF "$small/events.db: the disk is full" "$work/full.err"
    rm "$small/filler"
    [ "$("$pcieipc" events --store "$small/events.db" | grep -c .)" = 2 ]
    echo "ok: a full disk: named, the monitor stops, the two stored events are kept"
    "$pcieipc" monitor --source counters --sysfs-root "$root" --poll-ms 100 --store "$small/events.db" \
        --seconds 1.5 >/dev/null 2>/dev/null
    "$pcieipc" events --store "$small/events.db" --json | tail -1 | grep -q "\"short\":\"RxErr\"}\],\"kind\":\"aer\",\"occurrences\":8"
    [ "$("$pcieipc" events --store "$small/events.db" | grep -c .)" = 3 ]
    echo "ok: with room again, the errors it could not store are stored (8 Receiver Errors)"
' || { echo "FAIL: a read-only or full file system"; failures=$((failures + 1)); }

echo
if [ "$failures" -gt 0 ]; then
    echo "monitor stderr:"; cat "$work/monitor.err"
    die "$failures checks failed"
fi
echo "all checks passed"
