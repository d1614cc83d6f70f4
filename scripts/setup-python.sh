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
command -v python3 >/dev/null || die "python3 is missing (scripts/setup-host.sh installs it)"
python3 -c 'import venv, ensurepip' 2>/dev/null || {
    log "apt: installing python3-venv"
    DEBIAN_FRONTEND=noninteractive apt-get -q install -y --no-install-recommends python3-venv >/dev/null ||
        die "apt-get install python3-venv failed"
}
key="$( (python3 --version; cat "$REQUIREMENTS") | sha256sum | cut -c1-16)"
VENV="$PCIEIPC_CACHE/python-$key"
if [ ! -f "$VENV/ready" ]; then
    log "python: making $VENV (torch, numpy, pytest, maturin)"
    rm -rf "$VENV"
    python3 -m venv "$VENV" || die "python3 -m venv $VENV failed"
    pip=("$VENV/bin/pip" install -q --disable-pip-version-check)
    torch_pin="$(grep -E '^torch==' "$REQUIREMENTS")"
    if ! "${pip[@]}" --retries 0 --timeout 10 --index-url https://download.pytorch.org/whl/cpu \
        "$torch_pin" 2>/dev/null; then
        log "python: PyTorch's CPU index is not reachable; taking $torch_pin from PyPI (with its CUDA libraries)"
    fi
    "${pip[@]}" -r "$REQUIREMENTS" || die "pip install -r $REQUIREMENTS failed"
    "$VENV/bin/python" -c 'import torch, torch.distributed as dist; assert dist.is_gloo_available()' ||
        die "torch in $VENV does not import or has no Gloo"
    touch "$VENV/ready"
fi
echo "PYTHON=$VENV/bin/python"
