#!/usr/bin/env bash
# pcieipc's CUDA transport against NCCL on this machine's GPUs, one process
# per GPU, side by side in one run (alternating, best of REPEAT kept):
# float sum all_reduce from 8 B to 256 MiB, busbw = algbw · 2(n−1)/n.
# NCCL runs through torch.distributed with NCCL_NVLS_ENABLE=0 (no NVLink
# SHARP: the comparison is about the ring over PCIe/NVLink peer-to-peer).
#
# Usage: scripts/bench-vs-nccl.sh [NGPUS]     (default: every GPU; needs at least 2)
#   PCIEIPC=path/to/pcieipc (default: target/release/pcieipc, built if cargo is here)
#   BASELINE=path/to/another/pcieipc (an earlier commit's build): also run through the
#     same sweep, right after PCIEIPC in every round, and printed beside it with the
#     ratio of their busbw: a before/after from one run, with the same noise
#   REPEAT=3 ITERS=20 WARMUP=5
# Needs: python3 with torch (CUDA build) and torchrun, nvidia-smi.
set -euo pipefail
cd "$(dirname "$0")/.."

REPEAT=${REPEAT:-3}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
MIN_BYTES=8
MAX_BYTES=268435456
FACTOR=4
BASELINE=${BASELINE:-}

command -v nvidia-smi >/dev/null || { echo "bench-vs-nccl: nvidia-smi missing: this needs NVIDIA GPUs" >&2; exit 1; }
gpus_here=$(nvidia-smi -L | grep -c '^GPU ')
ngpus=${1:-$gpus_here}
if [ "$ngpus" -lt 2 ] || [ "$ngpus" -gt "$gpus_here" ]; then
    echo "bench-vs-nccl: needs 2 to $gpus_here GPUs here, asked for $ngpus (NCCL cannot put two ranks on one GPU)" >&2
    exit 1
fi
python3 -c 'import torch; assert torch.cuda.is_available()' ||
    { echo "bench-vs-nccl: python3 torch with CUDA is missing" >&2; exit 1; }
if [ -n "$BASELINE" ] && [ ! -x "$BASELINE" ]; then
    echo "bench-vs-nccl: BASELINE=$BASELINE is not an executable pcieipc binary" >&2
    exit 1
fi

if [ -z "${PCIEIPC:-}" ]; then
    cargo build --release -q -p pcieipc-cli
    PCIEIPC=target/release/pcieipc
fi
for lib in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$lib" ] && export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export NCCL_NVLS_ENABLE=0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gpu_list=$(seq -s, 0 $((ngpus - 1)))
echo "# $(nvidia-smi -L | head -"$ngpus" | tr '\n' ';')"
nvidia-smi topo -m || true
[ -z "$BASELINE" ] || echo "# pcieipc: $PCIEIPC, $("$PCIEIPC" --version); baseline: $BASELINE, $("$BASELINE" --version)"

for run in $(seq "$REPEAT"); do
    "$PCIEIPC" bench --transport cuda --nranks "$ngpus" --gpus "$gpu_list" \
        -b $MIN_BYTES -e $MAX_BYTES -f $FACTOR -n "$ITERS" -w "$WARMUP" -c 1 --json >"$work/pcieipc-$run.json"
    if [ -n "$BASELINE" ]; then
        "$BASELINE" bench --transport cuda --nranks "$ngpus" --gpus "$gpu_list" \
            -b $MIN_BYTES -e $MAX_BYTES -f $FACTOR -n "$ITERS" -w "$WARMUP" -c 1 --json >"$work/baseline-$run.json"
    fi
    torchrun --standalone --nproc-per-node "$ngpus" bench/nccl_allreduce.py \
        $MIN_BYTES $MAX_BYTES $FACTOR "$ITERS" "$WARMUP" >"$work/nccl-$run.jsonl"
done

python3 - "$work" "$REPEAT" "$ngpus" "$BASELINE" <<'PY'
import json, sys
work, repeat, n, with_baseline = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] != ""
pcieipc, baseline, nccl = {}, {}, {}

# Per size, the best (out of place, in place) times of a pcieipc binary's runs.
def keep_best(name, run, best):
    report = json.load(open(f"{work}/{name}-{run}.json"))
    if report["wrong"]:
        sys.exit(f"{name} bench reported {report['wrong']} wrong values")
    for row in report["results"]:
        times = (row["out_of_place"]["time_us"], row["in_place"]["time_us"])
        best[row["size_bytes"]] = tuple(map(min, best.get(row["size_bytes"], times), times))

for run in range(1, repeat + 1):
    keep_best("pcieipc", run, pcieipc)
    if with_baseline:
        keep_best("baseline", run, baseline)
    for line in open(f"{work}/nccl-{run}.jsonl"):
        row = json.loads(line)
        if row["wrong"]:
            sys.exit(f"NCCL all_reduce gave {row['wrong']} wrong values")
        nccl[row["size_bytes"]] = min(nccl.get(row["size_bytes"], row["ip_us"]), row["ip_us"])
busbw = lambda size, us: size / us / 1e3 * 2 * (n - 1) / n
cell = lambda size, us: f"{busbw(size, us):8.2f} {us:9.1f}"
print(f"# {n} GPUs, float sum, best of {repeat}: busbw GB/s and time us")
if not with_baseline:
    print(f"{'size (B)':>12}  {'pcieipc out-of-place':>20}  {'pcieipc in-place':>20}  {'NCCL in-place':>20}")
    for size in sorted(set(pcieipc) & set(nccl)):
        oop, ip = pcieipc[size]
        print(f"{size:>12}  {cell(size, oop):>20}  {cell(size, ip):>20}  {cell(size, nccl[size]):>20}")
else:
    # ratio = pcieipc's busbw / the baseline's (the baseline's time / pcieipc's): below 1, slower than before.
    print(f"{'size (B)':>12}  {'pcieipc out-of-place':>20}  {'baseline out-of-place':>21}  {'ratio':>5}  "
          f"{'pcieipc in-place':>20}  {'baseline in-place':>20}  {'ratio':>5}  {'NCCL in-place':>20}")
    worst = None
    for size in sorted(set(pcieipc) & set(baseline) & set(nccl)):
        (oop, ip), (base_oop, base_ip) = pcieipc[size], baseline[size]
        worst = min(worst or base_oop / oop, base_oop / oop, base_ip / ip)
        print(f"{size:>12}  {cell(size, oop):>20}  {cell(size, base_oop):>21}  {base_oop / oop:>5.2f}  "
              f"{cell(size, ip):>20}  {cell(size, base_ip):>20}  {base_ip / ip:>5.2f}  {cell(size, nccl[size]):>20}")
    print(f"# lowest ratio pcieipc / baseline: {worst:.2f} (of bests)")
PY
