#!/usr/bin/env bash
# pcieipc's all_reduce (2 ranks, shm transport) against OpenMPI's MPI_Allreduce
# (Debian's openmpi, shared-memory BTL "vader") on this host, in one go:
#
#   1. 8-byte latency, both;
#   2. busbw from 64 KiB to 256 MiB, float sum, out of place and in place, side
#      by side: each size of each side run REPEAT times, the sides alternating
#      size by size (a shared 2-core host is noisy, and alternating gives both
#      the same noise), the median compared, and the best printed beside it,
#      with the host's cross-core copy rate measured beside each size
#      (bench/cross_core.c: where the hypervisor puts the two vCPUs changes it
#      several-fold, and no run controls that); a run of either side that met
#      more of the hypervisor's steal than 1% of its timed CPU time is made
#      again (docs/bench-host.md says why), and the count printed;
#   3. the CPU time rank 0 uses while waiting LATE_MS for a late peer: pcieipc
#      as configured (bounded spin, then futex sleep), pcieipc forced to spin
#      the whole wait, and MPI (which polls).
#
# Usage: scripts/bench-vs-mpi.sh            (REPEAT=5 ITERS=20 WARMUP=5 TIMED_BYTES=256 MiB
#                                           LATE_MS=500 by default: each size is timed over
#                                           max(ITERS, TIMED_BYTES / size) calls after a tenth
#                                           as many, at least WARMUP, untimed;
#                                           LATENCY_REPEAT=3*REPEAT 8-byte alternations)
#        RELAY=1 scripts/bench-vs-mpi.sh    also runs pcieipc with --single-copy off (the
#                                           ring and its relay slots only), alternating with
#                                           the others, and prints it as a second table
#        BASELINE=path/to/pcieipc scripts/bench-vs-mpi.sh
#                                           also runs that other pcieipc binary (an earlier
#                                           commit's build) through the same latency and busbw
#                                           sweeps and the late-peer wait, alternating with the
#                                           others, and prints it beside this tree's pcieipc:
#                                           a before/after from one run, with the same noise
#        MIN_BYTES=65536 MAX_BYTES=268435456 the busbw sweep's range (a short trial run)
#        MIN_BYTES=4194304 MAX_BYTES=4194304 REPEAT=60 LATENCY_REPEAT=3 scripts/bench-vs-mpi.sh
#                                           many runs of one size: under the table, how many
#                                           of pcieipc's runs fell below MPI's median (the low
#                                           tail that decides how often a median of 5 could)
#        STEAL_RETRIES=0 scripts/bench-vs-mpi.sh
#                                           keeps every run as it came, whatever steal it met
#                                           (3 remakes at most by default)
#        KEEP=DIR scripts/bench-vs-mpi.sh  keeps every run's raw results (pcieipc's JSON
#                                           reports, MPI's lines, the host's rates, the runs
#                                           set aside for steal as *.stolen-N) in DIR
#        PCIEIPC=path/to/pcieipc scripts/bench-vs-mpi.sh
#                                           runs that prebuilt pcieipc instead of building
#                                           this tree, for a machine without cargo (the GPU
#                                           hosts: scripts/test-gpu.sh build puts one in its
#                                           folder)
# The header names the CPU and its caches. Exits non-zero when pcieipc's median
# is behind MPI's anywhere: 8-byte latency (in or out of place) or busbw at any
# size of the sweep.
# Needs: cargo (unless PCIEIPC is given), mpicc, gcc, mpirun
# (apt-get install openmpi-bin libopenmpi-dev).
set -euo pipefail
cd "$(dirname "$0")/.."

REPEAT=${REPEAT:-5}
LATENCY_REPEAT=${LATENCY_REPEAT:-$((REPEAT * 3))}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
TIMED_BYTES=${TIMED_BYTES:-268435456}
LATE_MS=${LATE_MS:-500}
RELAY=${RELAY:-0}
BASELINE=${BASELINE:-}
MIN_BYTES=${MIN_BYTES:-65536}
MAX_BYTES=${MAX_BYTES:-268435456}
PCIEIPC=${PCIEIPC:-}
KEEP=${KEEP:-}
STEAL_RETRIES=${STEAL_RETRIES:-3}

for knob in REPEAT LATENCY_REPEAT ITERS TIMED_BYTES MIN_BYTES MAX_BYTES; do
    [[ ${!knob} =~ ^[1-9][0-9]*$ ]] || { echo "bench-vs-mpi: $knob=${!knob} is not a positive whole number" >&2; exit 1; }
done
for knob in WARMUP LATE_MS STEAL_RETRIES; do
    [[ ${!knob} =~ ^[0-9]+$ ]] || { echo "bench-vs-mpi: $knob=${!knob} is not a whole number" >&2; exit 1; }
done
[ "$MIN_BYTES" -le "$MAX_BYTES" ] || { echo "bench-vs-mpi: MIN_BYTES=$MIN_BYTES is above MAX_BYTES=$MAX_BYTES" >&2; exit 1; }
tools=(mpicc gcc mpirun python3)
[ -n "$PCIEIPC" ] || tools+=(cargo)
for tool in "${tools[@]}"; do
    command -v "$tool" >/dev/null || { echo "bench-vs-mpi: $tool is missing (see the header)" >&2; exit 1; }
done
for binary in BASELINE PCIEIPC; do
    if [ -n "${!binary}" ] && [ ! -x "${!binary}" ]; then
        echo "bench-vs-mpi: $binary=${!binary} is not an executable pcieipc binary" >&2
        exit 1
    fi
done

work=$(mktemp -d)
# KEEP: the raw results are copied out however the run ends (a failing run's
# samples are the ones worth reading).
trap '[ -z "$KEEP" ] || { mkdir -p "$KEEP" && cp -r "$work"/. "$KEEP"/; }; rm -rf "$work"' EXIT

if [ -n "$PCIEIPC" ]; then
    pcieipc=$PCIEIPC
else
    cargo build --release -q -p pcieipc-cli
    target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    pcieipc="$target_dir/release/pcieipc"
fi
mpi_bench="$work/mpi_allreduce"
mpicc -O2 -o "$mpi_bench" bench/mpi_allreduce.c

# Running as root needs OpenMPI's explicit consent; vader is its shared-memory
# transport (self for a rank talking to itself).
mpi() {
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        mpirun --oversubscribe -np 2 --mca btl self,vader "$mpi_bench" "$@"
}

# A vCPU the hypervisor deschedules stops its rank, and the other waits: on the
# EPYC VM a run of 70 ms that met 10 ms of it fell from 11 GB/s to 2-5, on
# either side. The guest sees that time as steal (the 8th value of /proc/stat's
# cpu line, in USER_HZ ticks); a run that met more of it than 1% of the CPU
# time its timed calls took (2 ranks x calls x time per call, the same rule on
# both sides) is made again, up to STEAL_RETRIES times, and the count is
# printed. The reading spans the whole process, MPI's longer start included,
# so the rule remakes MPI's runs the more often, which if anything helps its
# medians. /proc/stat counts in whole ticks (10 ms): a run that met
# less can pass unseen, and a host that never reports steal remakes nothing.
stolen_ticks() { awk '$1 == "cpu" { print $9; exit }' /proc/stat; }
ticks_per_s=$(getconf CLK_TCK)
# timed_ms FILE CALLS: the ms a run's timed calls took, from pcieipc's JSON
# report or MPI's lines (size, then time and busbw out of place and in place).
timed_ms() {
    python3 - "$1" "$2" <<'PY'
import json, sys
text, calls = open(sys.argv[1]).read(), int(sys.argv[2])
if text.lstrip().startswith("{"):
    times = [row[kind]["time_us"] for row in json.loads(text)["results"] for kind in ("out_of_place", "in_place")]
else:
    times = [float(value) for line in text.splitlines() if line.strip() and not line.startswith("#")
             for value in line.split()[1::2]]
print(int(sum(times) * calls / 1000))
PY
}
# measured LABEL CALLS OUTPUT COMMAND...: COMMAND's stdout to OUTPUT, remade
# while the hypervisor stole more than the rule allows; "LABEL remakes
# stolen_ms allowed_ms" goes to $work/steal.txt, and each run set aside to
# OUTPUT.stolen-N.
measured() {
    local label=$1 calls=$2 output=$3 remakes=0 before stolen_ms allowed_ms
    shift 3
    while :; do
        before=$(stolen_ticks)
        "$@" >"$output"
        stolen_ms=$((($(stolen_ticks) - before) * 1000 / ticks_per_s))
        allowed_ms=$(($(timed_ms "$output" "$calls") * 2 / 100))
        [ "$stolen_ms" -gt "$allowed_ms" ] && [ "$remakes" -lt "$STEAL_RETRIES" ] || break
        remakes=$((remakes + 1))
        # Kept aside (KEEP shows what the rule set aside), out of the report's globs.
        mv "$output" "$output.stolen-$remakes"
    done
    echo "$label $remakes $stolen_ms $allowed_ms" >>"$work/steal.txt"
}

# The CPU decides the result (its caches above all): name it and its caches.
cache() { lscpu -C=NAME,ONE-SIZE,ALL-SIZE 2>/dev/null | awk -v level="$1" '$1 == level { print $2 " each, " $3 " in all" }'; }
# A VM's model name can be as bare as "AMD EPYC": family, model and stepping
# name the part, and whether a hypervisor sits between it and the run.
cpuinfo() { grep -m1 "^$1[[:space:]]*:" /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'; }
virtual=$(grep -qw hypervisor /proc/cpuinfo && echo ", under a hypervisor" || true)
echo "# host: $(nproc) CPUs, $(cpuinfo 'model name') (family $(cpuinfo 'cpu family') model $(cpuinfo model) stepping $(cpuinfo stepping))$virtual, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# caches: L1d $(cache L1d); L2 $(cache L2); L3 $(cache L3)"
echo "# pcieipc: $("$pcieipc" --version), OpenMPI: $(mpirun --version 2>/dev/null | head -1)"
[ -z "$BASELINE" ] || echo "# baseline: $BASELINE, $("$BASELINE" --version)"

# The baseline runs right after this tree's pcieipc in every round, with the
# same flags, so that both meet the same stretch of the host's noise.
# The 8-byte runs take a few milliseconds each, and the host flips every few
# seconds between a state where both sides run at about 0.25 us and one
# where both take 0.5-0.8 us (seen on an AMD EPYC: likely the vCPUs' placement),
# so they alternate LATENCY_REPEAT times: with five, one side could draw the
# slow state more often by chance.
for run in $(seq "$LATENCY_REPEAT"); do
    measured "pcieipc 8" 10000 "$work/pcieipc-8-$run.json" \
        "$pcieipc" bench -b 8 -e 8 -n 10000 -w 100 -c 1 --nranks 2 --json
    if [ -n "$BASELINE" ]; then
        measured "baseline 8" 10000 "$work/baseline-8-$run.json" \
            "$BASELINE" bench -b 8 -e 8 -n 10000 -w 100 -c 1 --nranks 2 --json
    fi
    measured "MPI 8" 10000 "$work/mpi-8-$run.txt" mpi 8 8 2 10000 100
    if [ "$RELAY" = 1 ]; then
        measured "relay 8" 10000 "$work/relay-8-$run.json" \
            "$pcieipc" bench -b 8 -e 8 -n 10000 -w 100 -c 1 --nranks 2 --single-copy off --json
    fi
done
# The busbw runs alternate per size, not per sweep: on a VM the host moves
# the two vCPUs now and then, and the rate at which two cores can copy to each
# other changes with it for seconds to minutes (bench/cross_core.c, the same
# hand-off in plain C, has read 5.4-6.9 GB/s, then 26, then 1.6 in 20 s). A
# whole sweep of one side could fall in one state and the other side's in
# another; one size of each, back to back, fall in the same one. The sides
# take turns going first, and the host's rate is measured beside each pair
# (bench/cross_core.c for 0.2 s) and printed in the table.
cross_core="$work/cross_core"
gcc -O2 -o "$cross_core" bench/cross_core.c
# Every size is timed over at least TIMED_BYTES: 20 calls of 128 KiB take
# about 0.4 ms, and one time slice the hypervisor takes from a vCPU (1 ms or
# more) in so short a window weighs more than the calls, on either side.
sizes=()
for ((size = MIN_BYTES; size <= MAX_BYTES; size *= 2)); do sizes+=("$size"); done
iters_for() { local n=$((TIMED_BYTES / $1)); echo $((n > ITERS ? n : ITERS)); }
warmup_for() { local n=$(($(iters_for "$1") / 10)); echo $((n > WARMUP ? n : WARMUP)); }
ours_at() { # NAME BINARY SIZE RUN [FLAGS...]: one size of one pcieipc side
    local name=$1 binary=$2 size=$3 run=$4 iters
    shift 4
    iters=$(iters_for "$size")
    measured "$name $size" "$iters" "$work/$name-$run.$size.json" \
        "$binary" bench -b "$size" -e "$size" -f 2 -n "$iters" -w "$(warmup_for "$size")" -c 1 \
        --nranks 2 "$@" --json
}
mpi_at() { # SIZE RUN
    local iters
    iters=$(iters_for "$1")
    measured "MPI $1" "$iters" "$work/mpi-$2.$1.txt" mpi "$1" "$1" 2 "$iters" "$(warmup_for "$1")"
}
ours_sides() { # SIZE RUN
    ours_at pcieipc "$pcieipc" "$1" "$2"
    [ -z "$BASELINE" ] || ours_at baseline "$BASELINE" "$1" "$2"
    [ "$RELAY" != 1 ] || ours_at relay "$pcieipc" "$1" "$2" --single-copy off
}
for run in $(seq "$REPEAT"); do
    for k in "${!sizes[@]}"; do
        size=${sizes[k]}
        echo "$size $("$cross_core" 0.2)" >>"$work/host-$run.txt"
        if [ $(((run + k) % 2)) = 1 ]; then
            ours_sides "$size" "$run"; mpi_at "$size" "$run"
        else
            mpi_at "$size" "$run"; ours_sides "$size" "$run"
        fi
    done
done

python3 - "$work" "$REPEAT" "$RELAY" "$BASELINE" "$LATENCY_REPEAT" "$STEAL_RETRIES" <<'EOF'
import glob, json, statistics, sys
work, repeat, relay, baseline = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] != ""
latency_repeat, steal_retries = int(sys.argv[5]), int(sys.argv[6])
# The paths each binary's reports name, apart: a baseline that took another
# path (algorithm) at some size is part of what a before/after shows.
paths = {"pcieipc": set(), "baseline": set()}

try:
    import jsonschema
    schema = json.load(open("docs/schemas/bench-v1.schema.json"))
except ImportError:
    jsonschema = None
    print("# bench JSON not validated against docs/schemas/bench-v1.schema.json: python3-jsonschema missing")

# Per size, the runs' (oop time, oop busbw, ip time, ip busbw).
def pcieipc(name, binary="pcieipc", runs_made=None):
    runs = {}
    for run in range(1, (runs_made or repeat) + 1):
        # A latency run's one report, or a busbw run's report per size.
        for file in glob.glob(f"{work}/{name}-{run}.json") + glob.glob(f"{work}/{name}-{run}.*.json"):
            report = json.load(open(file))
            if jsonschema:
                jsonschema.validate(report, schema)
            paths[binary].add(report.get("path", report["transport"]))
            if report["wrong"]:
                sys.exit(f"{binary} bench reported {report['wrong']} wrong values")
            for row in report["results"]:
                oop, ip = row["out_of_place"], row["in_place"]
                runs.setdefault(row["size_bytes"], []).append(
                    (oop["time_us"], oop["busbw_gb_s"], ip["time_us"], ip["busbw_gb_s"]))
    return runs

def mpi(name, runs_made=None):
    runs = {}
    for run in range(1, (runs_made or repeat) + 1):
        # A latency run's lines, or a busbw run's per size.
        for line in (line for file in glob.glob(f"{work}/{name}-{run}.txt") + glob.glob(f"{work}/{name}-{run}.*.txt")
                     for line in open(file)):
            if line.startswith("#") or not line.strip():
                continue
            size, *values = line.split()
            runs.setdefault(int(size), []).append(tuple(float(value) for value in values))
    return runs

# Median and best over the runs: times (index 0, 2) best lowest, busbw (1, 3) best highest.
def median(runs, at):
    return statistics.median(run[at] for run in runs)

def best(runs, at):
    return (min if at in (0, 2) else max)(run[at] for run in runs)

# The host's cross-core copy rate beside each size (bench/cross_core.c), per size.
host = {}
for run in range(1, repeat + 1):
    for line in open(f"{work}/host-{run}.txt"):
        size, rate = line.split()
        host.setdefault(int(size), []).append(float(rate))

# Columns as wide as their labels (pcieipc, MPI or baseline), so that a table
# without the baseline reads as it always has. The last column: the host's
# cross-core copy rate measured beside that size's runs, median (lowest-highest).
def table(ours, theirs, title, labels=("pcieipc", "MPI")):
    w_ours, w_theirs = len(labels[0]) + 6, len(labels[1]) + 6
    print(f"\n# {title}")
    print(f"#{'size':>11} {labels[0] + ' oop':>{w_ours}} {labels[1] + ' oop':>{w_theirs}} {'ratio':>6} "
          f"{labels[0] + ' ip':>{w_ours - 1}} {labels[1] + ' ip':>{w_theirs}} {'ratio':>6}   | best: oop ratio  ip ratio"
          f" | host GB/s")
    worst = worst_best = None
    # The run-to-run spread's low tail: the most of one size's runs on this
    # side that fell below the other side's median there.
    tail = (0, None, None)
    for size in sorted(ours):
        o, m = ours[size], theirs.get(size)
        if m is None:
            continue
        r_oop, r_ip = median(o, 1) / median(m, 1), median(o, 3) / median(m, 3)
        b_oop, b_ip = best(o, 1) / best(m, 1), best(o, 3) / best(m, 3)
        worst = min(worst or r_oop, r_oop, r_ip)
        worst_best = min(worst_best or b_oop, b_oop, b_ip)
        for kind, at in (("out of place", 1), ("in place", 3)):
            below = sum(run[at] < median(m, at) for run in o)
            if below > tail[0]:
                tail = (below, size, kind)
        rates = host.get(size, [])
        rate = f"{statistics.median(rates):.1f} ({min(rates):.1f}-{max(rates):.1f})" if rates else "-"
        print(f"{size:>12} {median(o, 1):>{w_ours}.2f} {median(m, 1):>{w_theirs}.2f} {r_oop:>6.2f} "
              f"{median(o, 3):>{w_ours - 1}.2f} {median(m, 3):>{w_theirs}.2f} {r_ip:>6.2f}   | {b_oop:>14.2f} {b_ip:>9.2f}"
              f" | {rate}")
    print(f"# lowest ratio: {worst:.2f} of medians, {worst_best:.2f} of bests")
    below, size, kind = tail
    where = f" ({size} B {kind})" if below else ""
    print(f"# {labels[0]}'s runs below {labels[1]}'s median busbw: at most {below} of {repeat} at one size{where}")
    return worst

ours8, theirs8 = pcieipc("pcieipc-8", runs_made=latency_repeat), mpi("mpi-8", latency_repeat)
if baseline:
    base8 = pcieipc("baseline-8", "baseline", latency_repeat)
print(f"\n# pcieipc: {'; '.join(sorted(paths['pcieipc']))}")
if baseline:
    print(f"# baseline: {'; '.join(sorted(paths['baseline']))}")
print(f"\n# 8-byte all_reduce latency (us), median (best) of {latency_repeat} alternating runs of 10000")
header = "#            pcieipc oop        MPI oop     pcieipc ip         MPI ip"
columns = [(ours8, 0), (theirs8, 0), (ours8, 2), (theirs8, 2)]
if baseline:
    header += "     baseline oop     baseline ip"
    columns += [(base8, 0), (base8, 2)]
print(header)
print(f"{'8 B':>12} " + "  ".join(f"{median(runs[8], at):>7.2f} ({best(runs[8], at):.2f})" for runs, at in columns))
# The gate: pcieipc's median 8-byte latency no higher than MPI's, in and out
# of place; the busbw gate follows the busbw table.
behind = [f"8 B {kind}: {median(ours8[8], at):.2f} us against {median(theirs8[8], at):.2f}"
          for kind, at in (("out of place", 0), ("in place", 2)) if median(ours8[8], at) > median(theirs8[8], at)]

theirs = mpi("mpi")
ours = pcieipc("pcieipc")
worst = table(ours, theirs,
              f"busbw (GB/s), float sum, 2 ranks, median of {repeat} runs alternating per size; ratio = pcieipc / MPI")
if worst < 1.0:
    behind.append(f"busbw: lowest median ratio {worst:.2f}")
if baseline:
    base = pcieipc("baseline", "baseline")
    table(base, theirs, "the baseline's busbw, same runs; ratio = baseline / MPI", ("baseline", "MPI"))
    table(ours, base, "this tree's pcieipc against the baseline, same runs; ratio = pcieipc / baseline "
          "(below 1: slower than before)", ("pcieipc", "baseline"))
if relay:
    relay8 = pcieipc("relay-8", runs_made=latency_repeat)
    print(f"\n# pcieipc --single-copy off, 8 B (us): {median(relay8[8], 0):.2f} / {median(relay8[8], 2):.2f}")
    table(pcieipc("relay"), theirs,
          "pcieipc --single-copy off (the ring and its relay slots only), same runs; ratio = relay / MPI")

# What the hypervisor's steal did to the runs (measured in the script), per side.
sides = {}
for line in open(f"{work}/steal.txt"):
    side, _size, remakes, stolen_ms, allowed_ms = line.split()
    kept, remade, over, stolen = sides.get(side, (0, 0, 0, 0))
    sides[side] = (kept + 1, remade + int(remakes), over + (int(stolen_ms) > int(allowed_ms)), stolen + int(stolen_ms))
print("\n# hypervisor steal (/proc/stat) per side: runs kept, runs made again because it took more than 1% of their"
      f" timed CPU time, kept over that after {steal_retries} remakes, steal met by the kept runs")
for side, (kept, remade, over, stolen) in sorted(sides.items()):
    print(f"#{side:>11} {kept:>5} kept {remade:>4} remade {over:>4} over {stolen:>7} ms")
if behind:
    print("\n# FAILED: pcieipc's median is behind MPI's: " + "; ".join(behind))
    open(f"{work}/behind", "w").write("\n".join(behind))
EOF

echo
echo "# CPU time of rank 0 while its peer is ${LATE_MS} ms late (8-byte all_reduce)"
"$pcieipc" bench --nranks 2 --late-peer-ms "$LATE_MS"
"$pcieipc" bench --nranks 2 --late-peer-ms "$LATE_MS" --spin-us $((LATE_MS * 2000))
mpi --late-peer-ms "$LATE_MS"
if [ -n "$BASELINE" ]; then
    echo "# baseline, as configured:"
    "$BASELINE" bench --nranks 2 --late-peer-ms "$LATE_MS"
fi
# Behind MPI anywhere: the run fails, so a regression cannot pass unseen.
[ ! -e "$work/behind" ]
