#!/usr/bin/env bash
# The main job: builds everything, probes this machine (PCIe topology, link
# health, P2P doctor, ring plan), runs the AllReduce benchmark with its
# correctness check on the default transport (and on the CUDA transport where
# there are GPUs), and boots the testbed to show
# the module at work (devices bound, link status, events).
source "$(dirname "$0")/common.sh"
cd "$REPO_ROOT"
# Everything this prints also goes to build/run.log; the testbed's whole
# console, the guest's kernel log included, to build/run-console.log.
mkdir -p build
run_log="$REPO_ROOT/build/run.log" console_log="$REPO_ROOT/build/run-console.log"
exec > >(tee "$run_log") 2>&1
bash scripts/build-all.sh
source build/env.sh

log "pcieipc probe (this machine)"
# Exit status 1 means findings at or above "error" (shown above): reported,
# and the benchmark still runs; 2 means the probe itself failed.
pcieipc probe || [ $? -eq 1 ]

log "pcieipc bench: AllReduce over the shm transport, 2 ranks, 8 B to 64 MiB, results checked"
pcieipc bench --nranks 2 -b 8 -e 64M -f 8 -n 20 -w 5 -c 1

if [ -c /dev/pcieipc ]; then
    log "the pcieipc module is loaded on this machine"
    pcieipc device version
    pcieipc device list
    ivshmem="$(pcieipc device list --json | grep -o '"kind":"ivshmem"' | wc -l)"
    if [ "$ivshmem" -ge 2 ]; then
        log "pcieipc bench over the module's $ivshmem ivshmem devices"
        pcieipc bench --transport pcieipc --nranks 2 -b 8 -e 1M -f 8 -n 20 -w 5 -c 1 --chunk-bytes 16K
    fi
fi

if command -v nvidia-smi >/dev/null && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ') && [ "$gpus" -ge 1 ]; then
    # One rank per GPU (rank r on GPU r mod the count); on a one-GPU
    # machine two ranks share it.
    nranks=$(( gpus >= 2 ? gpus : 2 ))
    log "pcieipc bench over this machine's $gpus GPU(s): CUDA transport, $nranks ranks, 8 B to 256 MiB, results checked"
    add_cuda_libraries
    pcieipc bench --transport cuda --nranks "$nranks" -b 8 -e 256M -f 8 -n 20 -w 5 -c 1
fi

log "testbed demo: tests/topologies/fabric.toml"
PCIEIPC_CONSOLE_LOG="$console_log" bash scripts/testbed.sh tests/topologies/fabric.toml tests/guest/demo.sh
log "the full log: $run_log (the testbed's whole console, the guest's kernel log included: $console_log)"
