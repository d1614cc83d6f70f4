#!/usr/bin/env bash
# pcieipc's CUDA paths with ranks sharing one GPU under MPS (the machine this
# project is lent has one), side by side in one run: the GPU hand-off peer to
# peer, the same through pinned host memory (with the link's limit measured
# in each run and each size's use of it), and the host hand-off; float sum
# all_reduce from 8 B to 256 MiB, results checked, medians of REPEAT
# alternating rounds. With BASELINE= another build runs right after this one
# in every round, and each size gets the ratio of their times: a before/after
# from one run, with the same noise.
#
# Usage: scripts/bench-cuda-one-gpu.sh
#   PCIEIPC=path/to/pcieipc (default: target/release/pcieipc, built if cargo is here)
#   BASELINE=path/to/another/pcieipc
#   ARGS="--copy-chunk 1M", BASELINE_ARGS=...: more flags for either side's
#   bench (the same binary as BASELINE with other ARGS compares settings)
#   MODES="gpu host-memory host" (which paths), NRANKS=2, REPEAT=3, ITERS=20,
#   WARMUP=5, MIN_BYTES=8, MAX_BYTES=268435456, FACTOR=4
#   MPS=0: no MPS daemon of the script's own (one is already running, or the
#   ranks are to be time-sliced)
# Needs: nvidia-smi and, unless MPS=0, nvidia-cuda-mps-control.
source "$(dirname "$0")/common.sh"
cd "$REPO_ROOT"

MODES=${MODES:-gpu host-memory host}
NRANKS=${NRANKS:-2}
REPEAT=${REPEAT:-3}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-5}
MIN_BYTES=${MIN_BYTES:-8}
MAX_BYTES=${MAX_BYTES:-268435456}
FACTOR=${FACTOR:-4}
BASELINE=${BASELINE:-}
ARGS=${ARGS:-}
BASELINE_ARGS=${BASELINE_ARGS:-}
MPS=${MPS:-1}

command -v nvidia-smi >/dev/null || die "nvidia-smi missing: this needs an NVIDIA GPU"
for mode in $MODES; do
    case "$mode" in
        gpu | host-memory | host) ;;
        *) die "MODES: no mode '$mode' (the modes: gpu host-memory host)" ;;
    esac
done
[ -z "$BASELINE" ] || [ -x "$BASELINE" ] || die "BASELINE=$BASELINE is not an executable pcieipc binary"
PCIEIPC=$(pcieipc_command)
add_cuda_libraries
use_work_dir
[ "$MPS" = 0 ] || start_mps_daemon

gpus=$(printf '0,%.0s' $(seq "$NRANKS"))
echo "# $(nvidia-smi -L | head -1); $NRANKS ranks on GPU 0$([ "$MPS" = 1 ] && echo ", under MPS")"
echo "# pcieipc: $PCIEIPC, $("$PCIEIPC" --version | head -1)"
[ -z "$ARGS" ] || echo "# pcieipc's flags: $ARGS"
[ -z "$BASELINE" ] || echo "# baseline: $BASELINE, $("$BASELINE" --version | head -1)${BASELINE_ARGS:+, flags: $BASELINE_ARGS}"

flags() {
    case "$1" in
        gpu) echo "--handoff gpu" ;;
        host-memory) echo "--handoff gpu --p2p off" ;;
        host) echo "--handoff host" ;;
    esac
}
for run in $(seq "$REPEAT"); do
    for mode in $MODES; do
        for side in pcieipc ${BASELINE:+baseline}; do
            binary=$PCIEIPC side_args=$ARGS
            [ "$side" = pcieipc ] || binary=$BASELINE side_args=$BASELINE_ARGS
            # shellcheck disable=SC2046,SC2086 # the mode's and the side's flags are words
            "$binary" bench --transport cuda --nranks "$NRANKS" --gpus "${gpus%,}" $(flags "$mode") $side_args \
                -b "$MIN_BYTES" -e "$MAX_BYTES" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" -c 1 --json \
                >"$work/$side-$mode-$run.json"
        done
    done
done

# Per mode and size, the medians of the runs (scripts/bench_compare.py one-gpu).
python3 scripts/bench_compare.py one-gpu "$work" --repeat "$REPEAT" --modes "$MODES" ${BASELINE:+--baseline}
