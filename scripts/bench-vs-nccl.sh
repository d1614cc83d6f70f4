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
#   LATENCY=1: both sides also time each timed call on its own (pcieipc's
#     between the job's ends of successive calls, which its calls stamp on
#     the GPU; NCCL's by events between the queued calls, each the ranks'
#     mean) and the per-call table
#     follows, in place (p50, p99, p99.7, max, stddev; scripts/bench_compare.py
#     nccl-latency); ITERS=1000 then, unless given
#   PLOT=FILE.svg (with LATENCY=1): one more run of each side, drawn side by
#     side (`pcieipc bench --latency-plot` with NCCL's calls as the peer)
# Needs: python3 with torch (CUDA build) and torchrun, nvidia-smi.
source "$(dirname "$0")/common.sh"
cd "$REPO_ROOT"

LATENCY=${LATENCY:-0}
PLOT=${PLOT:-}
REPEAT=${REPEAT:-3}
if [ "$LATENCY" = 1 ]; then ITERS=${ITERS:-1000}; else ITERS=${ITERS:-20}; fi
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
case "$LATENCY" in 0 | 1) ;; *) echo "bench-vs-nccl: LATENCY=$LATENCY: 0 or 1" >&2; exit 1 ;; esac
if [ -n "$PLOT" ] && [ "$LATENCY" != 1 ]; then
    echo "bench-vs-nccl: PLOT= draws the per-call times: it needs LATENCY=1" >&2
    exit 1
fi
if [ -n "$BASELINE" ] && [ ! -x "$BASELINE" ]; then
    echo "bench-vs-nccl: BASELINE=$BASELINE is not an executable pcieipc binary" >&2
    exit 1
fi

PCIEIPC=$(pcieipc_command)
add_cuda_libraries
export NCCL_NVLS_ENABLE=0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gpu_list=$(seq -s, 0 $((ngpus - 1)))
echo "# $(nvidia-smi -L | head -"$ngpus" | tr '\n' ';')"
nvidia-smi topo -m || true
[ -z "$BASELINE" ] || echo "# pcieipc: $PCIEIPC, $("$PCIEIPC" --version); baseline: $BASELINE, $("$BASELINE" --version)"

per_call=()
[ "$LATENCY" = 0 ] || per_call=(--latency)
for run in $(seq "$REPEAT"); do
    "$PCIEIPC" bench --transport cuda --nranks "$ngpus" --gpus "$gpu_list" "${per_call[@]}" \
        -b $MIN_BYTES -e $MAX_BYTES -f $FACTOR -n "$ITERS" -w "$WARMUP" -c 1 --json >"$work/pcieipc-$run.json"
    if [ -n "$BASELINE" ]; then
        "$BASELINE" bench --transport cuda --nranks "$ngpus" --gpus "$gpu_list" \
            -b $MIN_BYTES -e $MAX_BYTES -f $FACTOR -n "$ITERS" -w "$WARMUP" -c 1 --json >"$work/baseline-$run.json"
    fi
    torchrun --standalone --nproc-per-node "$ngpus" bench/nccl_allreduce.py \
        $MIN_BYTES $MAX_BYTES $FACTOR "$ITERS" "$WARMUP" "${per_call[@]}" >"$work/nccl-$run.jsonl"
done

# Per size, the best of the REPEAT runs, busbw and time (scripts/bench_compare.py nccl).
python3 scripts/bench_compare.py nccl "$work" --repeat "$REPEAT" --ngpus "$ngpus" ${BASELINE:+--baseline}
if [ "$LATENCY" = 1 ]; then
    echo
    python3 scripts/bench_compare.py nccl-latency "$work" --repeat "$REPEAT"
fi
if [ -n "$PLOT" ]; then
    torchrun --standalone --nproc-per-node "$ngpus" bench/nccl_allreduce.py \
        $MIN_BYTES $MAX_BYTES $FACTOR "$ITERS" "$WARMUP" --latency >"$work/nccl-plot.jsonl"
    "$PCIEIPC" bench --transport cuda --nranks "$ngpus" --gpus "$gpu_list" -c 1 \
        -b $MIN_BYTES -e $MAX_BYTES -f $FACTOR -n "$ITERS" -w "$WARMUP" \
        --latency-plot "$PLOT" --latency-peer "$work/nccl-plot.jsonl" --latency-peer-name "NCCL (torch)" >/dev/null
fi
