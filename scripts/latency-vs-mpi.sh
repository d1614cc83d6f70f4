#!/usr/bin/env bash
# Per-call latency distributions of pcieipc's all_reduce (2 ranks, shm
# transport) and OpenMPI's MPI_Allreduce (Debian's openmpi, shared-memory BTL
# "vader") on this host: each timed call timed on its own, the slowest rank's
# (`pcieipc bench --json`'s latency_us, bench/mpi_allreduce.c --latency),
# float sum, out of place and in place, back to back after a tenth as many
# untimed calls. The sides alternate size by size and take turns going
# first; the table gives each side's medians over the runs of p50, p99,
# p99.7, the maximum and the standard deviation (scripts/bench_compare.py
# latency). Both sides read the clock between calls here; in
# scripts/bench-vs-mpi.sh neither does. Before each round, bench/host_gaps.c measures for GAP_SECONDS
# what the host takes from the ranks' CPUs (0 and 1, where both sides bind
# their ranks): every stretch of more than 1 us the CPU was not running the
# loop. The table's last column is the share of calls of that size such gaps
# would hit for at least half their median: where it is above 0.3%, no
# all_reduce's p99.7 can stay within 1.5 times its p50 on this host. Up to
# TAIL_UP_TO, each round also times bench/handoff_floor.c, a bare 2-rank
# one-shot hand-off in C between the same two CPUs: the host's floor for a
# call of that size, its jitter included.
#
# Usage: scripts/latency-vs-mpi.sh          (REPEAT=3 MIN_BYTES=8 MAX_BYTES=268435456
#                                           FACTOR=4 TAIL_RATIO=1.5 TAIL_UP_TO=1048576 by
#                                           default; each size timed over
#                                           CALL_BYTES / size calls (4 GiB), at least
#                                           MIN_CALLS=400 (so that p99.7 is not the
#                                           maximum) and at most MAX_CALLS=10000)
#        PLOT=FILE.svg scripts/latency-vs-mpi.sh
#                                           also draws one more run of each side over
#                                           the same sizes, PLOT_CALLS=400 calls each,
#                                           with `pcieipc bench --latency-plot`
#        PCIEIPC=path/to/pcieipc scripts/latency-vs-mpi.sh
#                                           runs that prebuilt pcieipc instead of building
#                                           this tree (the GPU hosts have no cargo)
#        KEEP=DIR scripts/latency-vs-mpi.sh keeps every run's raw results in DIR
# Exits 3 when pcieipc's median p99.7 is above MPI's at any size, or above
# TAIL_RATIO times its own p50 at any size up to TAIL_UP_TO bytes.
# Needs: cargo (unless PCIEIPC is given), mpicc, gcc, mpirun, python3
# (apt-get install openmpi-bin libopenmpi-dev).
set -euo pipefail
cd "$(dirname "$0")/.."

REPEAT=${REPEAT:-3}
MIN_BYTES=${MIN_BYTES:-8}
MAX_BYTES=${MAX_BYTES:-268435456}
FACTOR=${FACTOR:-4}
CALL_BYTES=${CALL_BYTES:-4294967296}
MIN_CALLS=${MIN_CALLS:-400}
MAX_CALLS=${MAX_CALLS:-10000}
PLOT_CALLS=${PLOT_CALLS:-400}
GAP_SECONDS=${GAP_SECONDS:-1}
TAIL_RATIO=${TAIL_RATIO:-1.5}
TAIL_UP_TO=${TAIL_UP_TO:-1048576}
PLOT=${PLOT:-}
PCIEIPC=${PCIEIPC:-}
KEEP=${KEEP:-}

for knob in REPEAT MIN_BYTES MAX_BYTES FACTOR CALL_BYTES MIN_CALLS MAX_CALLS PLOT_CALLS TAIL_UP_TO; do
    [[ ${!knob} =~ ^[1-9][0-9]*$ ]] || { echo "latency-vs-mpi: $knob=${!knob} is not a positive whole number" >&2; exit 1; }
done
for knob in TAIL_RATIO GAP_SECONDS; do
    [[ ${!knob} =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "latency-vs-mpi: $knob=${!knob} is not a number" >&2; exit 1; }
done
[ "$(nproc)" -ge 2 ] || { echo "latency-vs-mpi: needs 2 CPUs, one per rank" >&2; exit 1; }
[ "$FACTOR" -ge 2 ] || { echo "latency-vs-mpi: FACTOR=$FACTOR must be at least 2" >&2; exit 1; }
[ "$MIN_BYTES" -le "$MAX_BYTES" ] || { echo "latency-vs-mpi: MIN_BYTES=$MIN_BYTES is above MAX_BYTES=$MAX_BYTES" >&2; exit 1; }
[ "$MIN_CALLS" -le "$MAX_CALLS" ] || { echo "latency-vs-mpi: MIN_CALLS=$MIN_CALLS is above MAX_CALLS=$MAX_CALLS" >&2; exit 1; }

source scripts/bench-mpi-common.sh
host_gaps="$work/host_gaps" handoff_floor="$work/handoff_floor"
gcc -O2 -o "$host_gaps" bench/host_gaps.c
gcc -O2 -o "$handoff_floor" bench/handoff_floor.c

echo "# host: $(nproc) CPUs, $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')$(grep -qw hypervisor /proc/cpuinfo && echo ', under a hypervisor' || true), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# pcieipc: $("$pcieipc" --version | head -1), OpenMPI: $(mpirun --version 2>/dev/null | head -1)"
sizes=()
for ((size = MIN_BYTES; size <= MAX_BYTES; size *= FACTOR)); do sizes+=("$size"); done
calls_for() {
    local n=$((CALL_BYTES / $1))
    ((n < MIN_CALLS)) && n=$MIN_CALLS
    ((n > MAX_CALLS)) && n=$MAX_CALLS
    echo "$n"
}
ours_at() { # SIZE RUN
    local calls
    calls=$(calls_for "$1")
    "$pcieipc" bench -b "$1" -e "$1" -n "$calls" -w $((calls / 10)) -c 1 --nranks 2 --latency --json \
        >"$work/pcieipc-$2.$1.json"
}
mpi_at() { # SIZE RUN
    local calls
    calls=$(calls_for "$1")
    mpi --latency "$1" "$1" 2 "$calls" $((calls / 10)) >"$work/mpi-$2.$1.txt"
}
floor_at() { # SIZE RUN
    local calls
    calls=$(calls_for "$1")
    "$handoff_floor" "$1" "$calls" $((calls / 10)) >"$work/floor-$2.$1.txt"
}
for run in $(seq "$REPEAT"); do
    "$host_gaps" 0 "$GAP_SECONDS" >"$work/gaps-$run.txt" &
    "$host_gaps" 1 "$GAP_SECONDS" >"$work/gaps-$run.1.txt"
    wait
    cat "$work/gaps-$run.1.txt" >>"$work/gaps-$run.txt" && rm "$work/gaps-$run.1.txt"
    for k in "${!sizes[@]}"; do
        if [ $(((run + k) % 2)) = 1 ]; then
            ours_at "${sizes[k]}" "$run"; mpi_at "${sizes[k]}" "$run"
        else
            mpi_at "${sizes[k]}" "$run"; ours_at "${sizes[k]}" "$run"
        fi
        [ "${sizes[k]}" -gt "$TAIL_UP_TO" ] || floor_at "${sizes[k]}" "$run"
    done
done
status=0
python3 scripts/bench_compare.py latency "$work" --repeat "$REPEAT" --tail-ratio "$TAIL_RATIO" \
    --tail-up-to "$TAIL_UP_TO" || status=$?
[ "$status" = 0 ] || [ "$status" = 3 ] || exit 1
if [ -n "$PLOT" ]; then
    mpi --latency "$MIN_BYTES" "$MAX_BYTES" "$FACTOR" "$PLOT_CALLS" $((PLOT_CALLS / 10)) >"$work/plot-mpi.txt"
    "$pcieipc" bench -b "$MIN_BYTES" -e "$MAX_BYTES" -f "$FACTOR" -n "$PLOT_CALLS" -w $((PLOT_CALLS / 10)) \
        --nranks 2 --latency-plot "$PLOT" --latency-peer "$work/plot-mpi.txt" >"$work/plot-pcieipc.txt"
fi
exit "$status"
