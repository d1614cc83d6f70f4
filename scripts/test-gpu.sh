#!/usr/bin/env bash
# The GPU tests: the CUDA transport on a real GPU (tests/cuda.rs: every dtype ×
# op against the CPU reference with 2 and 4 ranks, a killed rank, mismatched
# calls, the host-staged path, registered buffers, 1,000 communicators without
# leaking device memory; the GPU hand-off forced: every dtype × op through
# each algorithm, stream-ordered calls and CUDA graph replay, a killed rank
# named within the timeout; through device memory and through pinned shared
# host memory), the Python package on CUDA tensors (python/tests_gpu: every
# dtype × op through the torch backend, DDP against Gloo, step times), and
# `pcieipc bench --transport cuda` with 2 and 4
# ranks (and 2 on the GPU hand-off), results checked, through host memory
# with its measured link and each row's use of it. Several ranks share
# GPU 0.
#
#   scripts/test-gpu.sh              build here, then run here (needs cargo and a GPU)
#   scripts/test-gpu.sh build DIR    build only, into DIR (a machine without a GPU):
#                                    make dist's wheel and the CUDA tests' binary
#   scripts/test-gpu.sh run DIR      run what `build` left in DIR (a GPU machine
#                                    without cargo: copy DIR there first)
#
# `run` installs the wheel as a user's server would, with pip into a fresh
# virtual environment that also sees python3's packages (the machine's torch);
# the benches run its `pcieipc` command and the Python tests its package. Only
# the CUDA tests' binary is carried as built (a test, not what ships).
#
# PCIEIPC_GPU_TEST_ARGS: words handed to the CUDA tests' binary (libtest's
# filter and --skip), to split the suite where one sitting is too short.
# PCIEIPC_GPU_STEPS: which of its three steps `run` runs (default all:
# "cargo benches python"); the last line then names the steps not run.
#
# PCIEIPC_GPU_MPS=1 runs the ranks under an MPS daemon of the script's own
# (started in a private pipe directory, stopped at the end), as a job sharing
# one GPU between ranks would run: the ranks' kernels then run side by side
# instead of time-sliced, and the suite takes minutes instead of a quarter hour.
source "$(dirname "$0")/common.sh"
cd "$REPO_ROOT"

build() {
    local dir="$1"
    mkdir -p "$dir"
    local test_binary
    test_binary="$(cargo test --release -p pcieipc --features gpu-tests --test cuda --no-run --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)"
    [ -n "$test_binary" ] || die "building the GPU tests failed (run: cargo test -p pcieipc --features gpu-tests --test cuda --no-run)"
    local wheel
    wheel="$(bash scripts/build-dist.sh wheel | sed -n 's/^WHEEL=//p')"
    [ -f "$wheel" ] || die "scripts/build-dist.sh made no wheel"
    rm -f "$dir"/pcieipc-*.whl
    cp "$test_binary" "$dir/cuda-tests"
    cp "$wheel" "$dir/"
    log "GPU tests built into $dir"
}

run() {
    local dir="$1" failed=0 wheel
    wheel="$(ls "$dir"/pcieipc-*.whl 2>/dev/null | tail -1)"
    [ -x "$dir/cuda-tests" ] && [ -f "$wheel" ] || die "$dir lacks cuda-tests or the wheel: run scripts/test-gpu.sh build $dir first"
    local steps="${PCIEIPC_GPU_STEPS:-cargo benches python}" step
    for step in $steps; do
        case "$step" in
            cargo | benches | python) ;;
            *) die "PCIEIPC_GPU_STEPS: no step '$step' (the steps: cargo benches python)" ;;
        esac
    done
    command -v nvidia-smi >/dev/null && nvidia-smi -L || die "no GPU here (nvidia-smi not found): the GPU tests need one"
    use_work_dir
    python3 -m venv "$work/venv" || die "python3 -m venv failed here (Debian and Ubuntu: apt install python3-venv)"
    "$work/venv/bin/pip" install -q --disable-pip-version-check --no-index --no-deps "$wheel" || die "pip install $wheel failed"
    local pcieipc="$work/venv/bin/pcieipc" python="$work/venv/bin/python"
    # The machine's torch, wherever python3's environment keeps it (a venv of its own, often).
    python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
        >"$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/machine-python.pth"
    log "installed $(basename "$wheel") into a fresh virtual environment: $("$pcieipc" --version | head -1)"
    add_cuda_libraries
    if [ "${PCIEIPC_GPU_MPS:-0}" = 1 ]; then
        start_mps_daemon
        log "ranks share GPU 0 under MPS (daemon in $work/mps)"
    fi
    local skipped=""
    for step in cargo benches python; do
        if [[ " $steps " == *" $step "* ]]; then "${step}_step"; else skipped="$skipped $step"; fi
    done
    local verdict=PASSED
    [ "$failed" = 0 ] || verdict=FAILED
    if [ -n "$skipped" ]; then
        echo "GPU tests: $verdict (steps run: $steps; NOT RUN:$skipped)"
    else
        echo "GPU tests: $verdict"
    fi
    [ "$failed" = 0 ]
}

# The steps of `run`, which sets their variables (dir, pcieipc, python) and
# reads `failed` when they are done.
cargo_step() {
    log "cargo tests of the CUDA transport (one test at a time: their ranks share the GPU)"
    # shellcheck disable=SC2086 # PCIEIPC_GPU_TEST_ARGS: words for libtest
    "$dir/cuda-tests" --test-threads=1 --nocapture ${PCIEIPC_GPU_TEST_ARGS:-} || failed=1
}

benches_step() {
    for nranks in 2 4; do
        log "pcieipc bench --transport cuda, $nranks ranks on GPU 0, results checked"
        gpus="$(printf '0,%.0s' $(seq "$nranks"))"
        "$pcieipc" bench --transport cuda --nranks "$nranks" --gpus "${gpus%,}" \
            -b 8 -e 256M -f 8 -n 20 -w 5 -c 1 || failed=1
    done
    log "pcieipc bench --transport cuda --handoff gpu, 2 ranks on GPU 0 (forced: they are time-sliced), results checked"
    "$pcieipc" bench --transport cuda --nranks 2 --gpus 0,0 --handoff gpu \
        -b 8 -e 256M -f 8 -n 20 -w 5 -c 1 || failed=1
    log "pcieipc bench --transport cuda --handoff gpu --p2p off, 2 ranks on GPU 0: kernels through pinned shared host memory, results checked"
    "$pcieipc" bench --transport cuda --nranks 2 --gpus 0,0 --handoff gpu --p2p off \
        -b 8 -e 256M -f 8 -n 20 -w 5 -c 1 || failed=1
    log "the same, one thread block a launch (--handoff-blocks 1), results checked"
    "$pcieipc" bench --transport cuda --nranks 2 --gpus 0,0 --handoff gpu --p2p off --handoff-blocks 1 \
        -b 8 -e 64M -f 8 -n 20 -w 5 -c 1 >"$dir/one-block.out" || failed=1
    cat "$dir/one-block.out"
    grep -q "up to 1 blocks a launch" "$dir/one-block.out" || { echo "the header does not say 1 block a launch"; failed=1; }
    # The link to host memory measured before the sweep (one GPU, both
    # ranks on it), and every row's use of it: above nothing, and not
    # past the limit by more than the two measurements' noise.
    log "the same, --json: the measured link to host memory and each row's use of it"
    "$pcieipc" bench --transport cuda --nranks 2 --gpus 0,0 --handoff gpu --p2p off \
        -b 64K -e 256M -f 8 -n 20 -w 5 -c 1 --json >"$dir/host-link.json" || failed=1
    python3 - "$dir/host-link.json" <<'CHECK' || failed=1
import json, sys
report = json.load(open(sys.argv[1]))
links = report["host_links"]
assert len(links) == 1 and links[0]["ranks"] == [0, 1], links
link = links[0]
assert 1 < link["limit_gb_s"] == min(link["both_to_gpu_gb_s"], link["both_from_gpu_gb_s"]), link
for row in report["results"]:
    for placement in ("out_of_place", "in_place"):
        use = row[placement]["link_utilisation"]
        assert 0 < use <= 1.1, f'{row["size_bytes"]} B {placement}: link use {use} of {link}'
print(f'link to host memory: limit {link["limit_gb_s"]:.1f} GB/s, link use at 256 MiB '
      f'{report["results"][-1]["out_of_place"]["link_utilisation"]:.2f}')
CHECK
    # Each call timed: 300 calls per size and placement, the percentiles in
    # order, and their mean the report's time_us. On the GPU hand-off (the
    # calls queued ahead, held by a gate, timed between the job's ends of
    # successive calls, which the calls stamp on the GPU) that is the same
    # sum; on the host hand-off each call is the slowest rank's and time_us
    # the host's clock over all of them: within a quarter.
    for handoff in gpu host; do
        log "pcieipc bench --transport cuda --handoff $handoff --json, 2 ranks on GPU 0: per-call latency"
        "$pcieipc" bench --transport cuda --nranks 2 --gpus 0,0 --handoff "$handoff" \
            -b 8 -e 1M -f 32 -n 300 -w 30 -c 1 --latency --json >"$dir/latency-$handoff.json" || failed=1
        python3 - "$dir/latency-$handoff.json" "$handoff" <<'CHECK' || failed=1
import json, sys
report = json.load(open(sys.argv[1]))
margin = 1e-3 if sys.argv[2] == "gpu" else 0.25
for row in report["results"]:
    for placement in ("out_of_place", "in_place"):
        measured = row[placement]
        latency = measured["latency_us"]
        ladder = [latency[key] for key in ("p50", "p90", "p99", "p99_7", "max")]
        where = f'{row["size_bytes"]} B {placement}: {latency}, time_us {measured["time_us"]}'
        assert latency["calls"] == 300, where
        assert ladder == sorted(ladder) and ladder[0] > 0, where
        assert abs(latency["mean"] - measured["time_us"]) <= margin * measured["time_us"] + 1e-3, where
print(f"per-call latency: {len(report['results'])} sizes checked")
CHECK
    done
    log "the same, the timed calls captured in a CUDA graph and replayed (-G)"
    "$pcieipc" bench --transport cuda --nranks 2 --gpus 0,0 --handoff gpu -G \
        -b 8 -e 256M -f 64 -n 20 -w 5 -c 1 || failed=1
}

python_step() {
    log "the Python package (the wheel's) on CUDA tensors (python/tests_gpu), with the machine's torch"
    "$python" -c 'import torch; assert torch.cuda.is_available()' || die "python3 here has no torch with CUDA: the Python GPU tests need it"
    "$python" python/tests_gpu/test_gpu.py || failed=1
}

case "${1:-}" in
    build) build "${2:?usage: scripts/test-gpu.sh build DIR}" ;;
    run) run "${2:?usage: scripts/test-gpu.sh run DIR}" ;;
    "") dir="$REPO_ROOT/build/gpu"; build "$dir"; run "$dir" ;;
    *) die "usage: scripts/test-gpu.sh [build DIR | run DIR]" ;;
esac
