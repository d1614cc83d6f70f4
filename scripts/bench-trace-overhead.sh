#!/usr/bin/env bash
# What tracing costs: `pcieipc bench` (shm, 2 ranks) of a build without the
# tracing code, or the build before a change to it (BASELINE=<its
# pcieipc>; the table's "no tracing code" column), this build with tracing off, and
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
    "$binary" bench --nranks 2 "${sizes[@]}" "$@" > "$work/$name-$round.out" ||
        die "$name (round $round) failed: $(cat "$work/$name-$round.out")"
}
for round in $(seq "$repeat"); do
    log "round $round of $repeat"
    run baseline "$round" "$BASELINE"
    run off "$round" "$current"
    run on "$round" "$current" --trace "$work/trace.json"
done
# The medians of each build's text tables, and the ratios (scripts/bench_compare.py trace-overhead).
python3 scripts/bench_compare.py trace-overhead "$work" --repeat "$repeat"
