#!/usr/bin/env bash
# pcieipc's all_reduce (2 ranks, shm transport) against OpenMPI's MPI_Allreduce
# (Debian's openmpi, shared-memory BTL "vader") on this host, in one go:
#
#   1. 8-byte latency, both;
#   2. busbw from 64 KiB to 256 MiB, float sum, out of place and in place, side
#      by side (each side run REPEAT times, alternately, best of the runs kept:
#      a shared 2-core host is noisy, and alternating gives both the same noise);
#   3. the CPU time rank 0 uses while waiting LATE_MS for a late peer: pcieipc
#      as configured (bounded spin, then futex sleep), pcieipc forced to spin
#      the whole wait, and MPI (which polls).
#
# Usage: scripts/bench-vs-mpi.sh            (REPEAT=3 ITERS=20 LATE_MS=500 by default)
#        RELAY=1 scripts/bench-vs-mpi.sh    also runs pcieipc with --single-copy off (the
#                                           two-copy relay all-gather), alternating with the
#                                           others, and prints it as a third column
# Needs: cargo, mpicc, mpirun (apt-get install openmpi-bin libopenmpi-dev).
set -euo pipefail
cd "$(dirname "$0")/.."

REPEAT=${REPEAT:-3}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
LATE_MS=${LATE_MS:-500}
RELAY=${RELAY:-0}
MIN_BYTES=65536
MAX_BYTES=268435456

for tool in cargo mpicc mpirun python3; do
    command -v "$tool" >/dev/null || { echo "bench-vs-mpi: $tool is missing (see the header)" >&2; exit 1; }
done

cargo build --release -q -p pcieipc-cli
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
pcieipc="$target_dir/release/pcieipc"
mpi_bench="$target_dir/release/mpi_allreduce"
mpicc -O2 -o "$mpi_bench" bench/mpi_allreduce.c

# Running as root needs OpenMPI's explicit consent; vader is its shared-memory
# transport (self for a rank talking to itself).
mpi() {
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        mpirun --oversubscribe -np 2 --mca btl self,vader "$mpi_bench" "$@"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "# host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# pcieipc: $("$pcieipc" --version), OpenMPI: $(mpirun --version 2>/dev/null | head -1)"

for run in $(seq "$REPEAT"); do
    "$pcieipc" bench -b 8 -e 8 -n 10000 -w 100 -c 1 --nranks 2 --json >"$work/pcieipc-8-$run.json"
    mpi 8 8 2 10000 100 >"$work/mpi-8-$run.txt"
    "$pcieipc" bench -b $MIN_BYTES -e $MAX_BYTES -f 2 -n "$ITERS" -w "$WARMUP" -c 1 --nranks 2 --json \
        >"$work/pcieipc-$run.json"
    mpi $MIN_BYTES $MAX_BYTES 2 "$ITERS" "$WARMUP" >"$work/mpi-$run.txt"
    if [ "$RELAY" = 1 ]; then
        "$pcieipc" bench -b 8 -e 8 -n 10000 -w 100 -c 1 --nranks 2 --single-copy off --json \
            >"$work/relay-8-$run.json"
        "$pcieipc" bench -b $MIN_BYTES -e $MAX_BYTES -f 2 -n "$ITERS" -w "$WARMUP" -c 1 --nranks 2 \
            --single-copy off --json >"$work/relay-$run.json"
    fi
done

python3 - "$work" "$REPEAT" "$RELAY" <<'EOF'
import json, sys
work, repeat, relay = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
paths = set()

try:
    import jsonschema
    schema = json.load(open("docs/schemas/bench-v1.schema.json"))
except ImportError:
    jsonschema = None
    print("# bench JSON not validated against docs/schemas/bench-v1.schema.json: python3-jsonschema missing")

def pcieipc(name):
    best = {}
    for run in range(1, repeat + 1):
        report = json.load(open(f"{work}/{name}-{run}.json"))
        if jsonschema:
            jsonschema.validate(report, schema)
        paths.add(report.get("path", report["transport"]))
        if report["wrong"]:
            sys.exit(f"pcieipc bench reported {report['wrong']} wrong values")
        for row in report["results"]:
            size = row["size_bytes"]
            oop, ip = row["out_of_place"], row["in_place"]
            old = best.get(size)
            best[size] = (
                min(oop["time_us"], old[0]) if old else oop["time_us"],
                max(oop["busbw_gb_s"], old[1]) if old else oop["busbw_gb_s"],
                min(ip["time_us"], old[2]) if old else ip["time_us"],
                max(ip["busbw_gb_s"], old[3]) if old else ip["busbw_gb_s"],
            )
    return best

def mpi(name):
    best = {}
    for run in range(1, repeat + 1):
        for line in open(f"{work}/{name}-{run}.txt"):
            if line.startswith("#") or not line.strip():
                continue
            size, oop_t, oop_bw, ip_t, ip_bw = line.split()
            size = int(size)
            values = (float(oop_t), float(oop_bw), float(ip_t), float(ip_bw))
            old = best.get(size)
            best[size] = values if old is None else (
                min(values[0], old[0]), max(values[1], old[1]), min(values[2], old[2]), max(values[3], old[3]))
    return best

ours8, theirs8 = pcieipc("pcieipc-8"), mpi("mpi-8")
print(f"\n# pcieipc: {'; '.join(sorted(paths))}")
print(f"\n# 8-byte all_reduce latency, best of {repeat} runs of 10000 (us)")
print(f"#            pcieipc oop   MPI oop   pcieipc ip    MPI ip")
print(f"{'8 B':>12} {ours8[8][0]:>12.2f} {theirs8[8][0]:>9.2f} {ours8[8][2]:>12.2f} {theirs8[8][2]:>9.2f}")

ours, theirs = pcieipc("pcieipc"), mpi("mpi")
print(f"\n# busbw (GB/s), float sum, 2 ranks, best of {repeat} runs; ratio = pcieipc / MPI")
print(f"#       size   pcieipc oop   MPI oop  ratio   pcieipc ip    MPI ip  ratio")
worst = None
for size in sorted(ours):
    o, m = ours[size], theirs.get(size)
    if m is None:
        continue
    r_oop, r_ip = o[1] / m[1], o[3] / m[3]
    worst = min(worst or r_oop, r_oop, r_ip)
    print(f"{size:>12} {o[1]:>13.2f} {m[1]:>9.2f} {r_oop:>6.2f} {o[3]:>12.2f} {m[3]:>9.2f} {r_ip:>6.2f}")
print(f"# lowest ratio: {worst:.2f}")

if relay:
    relay8, relays = pcieipc("relay-8"), pcieipc("relay")
    print(f"\n# pcieipc --single-copy off (two-copy relay all-gather), same runs; ratio = relay / MPI")
    print(f"{'8 B (us)':>12} {relay8[8][0]:>13.2f} {'':>9} {'':>6} {relay8[8][2]:>12.2f}")
    for size in sorted(relays):
        o, m = relays[size], theirs.get(size)
        if m is None:
            continue
        print(f"{size:>12} {o[1]:>13.2f} {m[1]:>9.2f} {o[1] / m[1]:>6.2f} {o[3]:>12.2f} {m[3]:>9.2f} {o[3] / m[3]:>6.2f}")
EOF

echo
echo "# CPU time of rank 0 while its peer is ${LATE_MS} ms late (8-byte all_reduce)"
"$pcieipc" bench --nranks 2 --late-peer-ms "$LATE_MS"
"$pcieipc" bench --nranks 2 --late-peer-ms "$LATE_MS" --spin-us $((LATE_MS * 2000))
mpi --late-peer-ms "$LATE_MS"
