#!/usr/bin/env bash
# examples/ddp_train.py under torchrun with each backend, alternating,
# REPEAT times (default 3): prints every run's median step time and, per
# backend, the median of those. DEVICE=cuda trains on GPUs (one per rank, or
# GPU 0 for all where there is one: then set PCIEIPC_HANDOFF=gpu and run MPS).
#   scripts/bench-ddp.sh [BACKEND...]     (default: gloo pcieipc pcieipc-hook)
source "$(dirname "$0")/common.sh"
REPEAT="${REPEAT:-3}"; DEVICE="${DEVICE:-cpu}"; NPROC="${NPROC:-2}"; STEPS="${STEPS:-200}"
backends=("$@"); [ "${#backends[@]}" -gt 0 ] || backends=(gloo pcieipc pcieipc-hook)
if [ -z "${PYTHON:-}" ]; then
    eval "$(bash "$REPO_ROOT/scripts/python-build.sh" | grep -E '^(PYTHON|PYTHONPATH)=')"
fi
export PYTHONPATH OMP_NUM_THREADS=1
echo "examples/ddp_train.py, $NPROC ranks on $DEVICE, $STEPS steps, median step time (ms), $REPEAT alternating runs"
echo "CPU: $(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2- | sed "s/^ *//"), $(getconf _NPROCESSORS_ONLN) CPUs"
use_work_dir
for run in $(seq "$REPEAT"); do
    for backend in "${backends[@]}"; do
        out="$("$PYTHON" -m torch.distributed.run --nproc-per-node "$NPROC" "$REPO_ROOT/examples/ddp_train.py" \
            --backend "$backend" --device "$DEVICE" --steps "$STEPS" 2>&1)" || { echo "$out" | tail -20; die "$backend failed"; }
        ms="$(echo "$out" | sed -n 's/.*median step \([0-9.]*\) ms.*/\1/p')"
        [ -n "$ms" ] || { echo "$out" | tail -20; die "$backend printed no step time"; }
        echo "run $run: $backend $ms" | tee -a "$work/runs.txt"
    done
done
# Per backend, the median of its runs' step times (scripts/bench_compare.py ddp).
python3 "$REPO_ROOT/scripts/bench_compare.py" ddp "$work/runs.txt"
