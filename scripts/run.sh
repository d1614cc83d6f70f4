#!/usr/bin/env bash
# The main job: builds everything, then boots the testbed with the module and
# shows the device and the PCIe fabric from inside the guest.
source "$(dirname "$0")/common.sh"
cd "$REPO_ROOT"
bash scripts/build-all.sh
source build/env.sh
log "testbed demo: tests/topologies/fabric.toml"
bash scripts/testbed.sh tests/topologies/fabric.toml tests/guest/demo.sh
