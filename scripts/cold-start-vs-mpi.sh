#!/usr/bin/env bash
# How many calls pcieipc's all_reduce (2 ranks, shm transport) and OpenMPI's
# MPI_Allreduce (Debian's openmpi, shared-memory BTL "vader") take at each new
# message size to come within 10% of their steady time, on this host:
# `pcieipc bench --cold-start` and bench/mpi_allreduce.c --cold-start, each
# size from cold (fresh buffers, no warm-up), each call timed on its own (the
# slowest rank's), float sum, out of place. The sides alternate run by run;
# the table gives each side's medians over the runs of the first call, the
# steady time (the median of the last quarter of the calls) and the calls to
# within 10% of it (scripts/bench_compare.py cold-start), and beside them the
# passes a plain memcpy of both ranks' buffers takes to do the same
# (bench/copy_warmup.c): where the host's last-level cache takes in a working
# set over several passes, no all_reduce is steady sooner.
#
# Usage: scripts/cold-start-vs-mpi.sh       (REPEAT=3 ITERS=40 MIN_BYTES=65536
#                                           MAX_BYTES=268435456 AT_MOST=5 by default)
#        PCIEIPC=path/to/pcieipc scripts/cold-start-vs-mpi.sh
#                                           runs that prebuilt pcieipc instead of building
#                                           this tree (the GPU hosts have no cargo)
#        KEEP=DIR scripts/cold-start-vs-mpi.sh
#                                           keeps every run's raw results in DIR
# Exits 3 when pcieipc's median calls to steady exceed AT_MOST at any size.
# Needs: cargo (unless PCIEIPC is given), mpicc, gcc, mpirun, python3
# (apt-get install openmpi-bin libopenmpi-dev).
set -euo pipefail
cd "$(dirname "$0")/.."

REPEAT=${REPEAT:-3}
ITERS=${ITERS:-40}
MIN_BYTES=${MIN_BYTES:-65536}
MAX_BYTES=${MAX_BYTES:-268435456}
AT_MOST=${AT_MOST:-5}
PCIEIPC=${PCIEIPC:-}
KEEP=${KEEP:-}

for knob in REPEAT ITERS MIN_BYTES MAX_BYTES AT_MOST; do
    [[ ${!knob} =~ ^[1-9][0-9]*$ ]] || { echo "cold-start-vs-mpi: $knob=${!knob} is not a positive whole number" >&2; exit 1; }
done
[ "$ITERS" -ge 4 ] || { echo "cold-start-vs-mpi: ITERS=$ITERS: the steady time needs 4 calls or more" >&2; exit 1; }
[ "$MIN_BYTES" -le "$MAX_BYTES" ] || { echo "cold-start-vs-mpi: MIN_BYTES=$MIN_BYTES is above MAX_BYTES=$MAX_BYTES" >&2; exit 1; }

source scripts/bench-mpi-common.sh
copy_warmup="$work/copy_warmup"
gcc -O2 -o "$copy_warmup" bench/copy_warmup.c

echo "# host: $(nproc) CPUs, $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')$(grep -qw hypervisor /proc/cpuinfo && echo ', under a hypervisor' || true)"
echo "# pcieipc: $("$pcieipc" --version | head -1), OpenMPI: $(mpirun --version 2>/dev/null | head -1)"
for run in $(seq 1 "$REPEAT"); do
    "$pcieipc" bench --cold-start --json -b "$MIN_BYTES" -e "$MAX_BYTES" -n "$ITERS" >"$work/pcieipc-$run.json"
    mpi --cold-start "$MIN_BYTES" "$MAX_BYTES" 2 "$ITERS" >"$work/mpi-$run.txt"
    "$copy_warmup" "$MIN_BYTES" "$MAX_BYTES" 2 "$ITERS" >"$work/copy-$run.txt"
done
python3 scripts/bench_compare.py cold-start "$work" --repeat "$REPEAT" --at-most "$AT_MOST"
