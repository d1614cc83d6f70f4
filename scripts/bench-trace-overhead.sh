#!/usr/bin/env bash
# What tracing costs: `pcieipc bench` (shm, 2 ranks) of a build without the
# tracing code (BASELINE=<its pcieipc>), this build with tracing off, and
# this build with `--trace`, alternating in one run, REPEAT rounds (default
# 5); prints the median busbw (GB/s) per size, and the 8-byte time (µs),
# and each build's speed against the one without tracing code.
#
#   BASELINE=build/pcieipc-baseline scripts/bench-trace-overhead.sh
source "$(dirname "$0")/common.sh"
cd "$REPO_ROOT"

: "${BASELINE:?set BASELINE to a pcieipc built without the tracing code (git worktree add, cargo build --release)}"
[ -x "$BASELINE" ] || die "BASELINE=$BASELINE is not an executable"
repeat="${REPEAT:-5}"
cargo build --release -q -p pcieipc-cli
current=target/release/pcieipc
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
sizes=(-b 8 -e 16M -f 16 -n 50 -w 10 -c 1)

run() {
    local name="$1" round="$2" binary="$3"; shift 3
    "$binary" bench --nranks 2 "${sizes[@]}" "$@" > "$work/$name.out" ||
        die "$name (round $round) failed: $(cat "$work/$name.out")"
    awk '/^ +[0-9]/ {print $1, $6, $8, $10, $12}' "$work/$name.out" > "$work/$name.$round"
}
for round in $(seq "$repeat"); do
    log "round $round of $repeat"
    run baseline "$round" "$BASELINE"
    run off "$round" "$current"
    run on "$round" "$current" --trace "$work/trace.json"
done
python3 - "$work" "$repeat" <<'PY'
import statistics, sys
work, repeat = sys.argv[1], int(sys.argv[2])
def table(name):
    rows = {}
    for round in range(1, repeat + 1):
        for line in open(f"{work}/{name}.{round}"):
            size, t_out, bw_out, t_in, bw_in = line.split()
            rows.setdefault(int(size), []).append((float(t_out), float(bw_out), float(t_in), float(bw_in)))
    return {size: [statistics.median(column) for column in zip(*values)] for size, values in rows.items()}
base, off, on = table("baseline"), table("off"), table("on")
print(f"# medians of {repeat} alternating rounds; busbw GB/s out of place / in place (8 B: time in µs);")
print("# off/none, on/none: speed against the build without tracing code (above 1: faster)")
print(f"{'size':>10} {'no tracing code':>20} {'tracing off':>20} {'tracing on':>20} {'off/none':>9} {'on/none':>9}")
for size in sorted(base):
    column = 0 if size == 8 else 1
    b, f, n = base[size], off[size], on[size]
    cell = lambda r: f"{r[column]:.2f} / {r[column + 2]:.2f}"
    # Speed relative to no tracing code (above 1: faster): bandwidths
    # divide one way, the 8-byte times the other.
    ratio = lambda r: ((r[column] + r[column + 2]) / (b[column] + b[column + 2])) ** (-1 if size == 8 else 1)
    print(f"{size:>10} {cell(b):>20} {cell(f):>20} {cell(n):>20} {ratio(f):>9.3f} {ratio(n):>9.3f}")
PY
