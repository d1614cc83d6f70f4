#!/usr/bin/env bash
# Makes the virtual environment the Python package is built and tested in:
# maturin, pytest, numpy and torch (python/requirements-test.txt), cached
# under $PCIEIPC_CACHE keyed by that file and the interpreter's version, so a
# fresh clone on the same machine reuses it. Prints PYTHON=<its interpreter>.
#
# torch: PyTorch's CPU-only index is tried first (a 200 MB wheel); where only
# PyPI is reachable (as on the development machines) PyPI's wheel is taken,
# which brings its CUDA libraries (about 3.8 GB, 45 s to fetch here). Both
# run the CPU tests alike.
source "$(dirname "$0")/common.sh"
REQUIREMENTS="$REPO_ROOT/python/requirements-test.txt"
# torch the light way where it can be had: before the requirements pull PyPI's.
torch_from_cpu_index() {
    local torch_pin
    torch_pin="$(grep -E '^torch==' "$REQUIREMENTS")"
    if ! "$1/bin/pip" install -q --disable-pip-version-check --retries 0 --timeout 10 \
        --index-url https://download.pytorch.org/whl/cpu "$torch_pin" 2>/dev/null; then
        log "python: PyTorch's CPU index is not reachable; taking $torch_pin from PyPI (with its CUDA libraries)"
    fi
}
torch_has_gloo() {
    "$1/bin/python" -c 'import torch, torch.distributed as dist; assert dist.is_gloo_available()' ||
        die "torch in $1 does not import or has no Gloo"
}
VENV="$(cached_venv python "$REQUIREMENTS" torch_from_cpu_index torch_has_gloo)"
echo "PYTHON=$VENV/bin/python"
