#!/usr/bin/env bash
# The Python package's tests (CPU): builds the abi3 wheel, installs it into
# build/python-site and runs python/tests with pytest in the cached virtual
# environment (scripts/setup-python.sh): every collective and dtype on 2 and
# 3 ranks against Gloo, DDP with the backend and with the hook against Gloo,
# 2 simulated nodes × 2 ranks against a flat Gloo group, a killed rank, and
# the DDP example and the README's Python example under torchrun. Also checks that the wheel serves
# CPython 3.9+ (its abi3 tag) and that the type stubs match the module.
source "$(dirname "$0")/common.sh"
eval "$(bash "$REPO_ROOT/scripts/python-build.sh" | grep -E '^(PYTHON|WHEEL|PYTHONPATH)=')"
export PYTHONPATH
case "$WHEEL" in
    *-cp39-abi3-*) ;;
    *) die "the wheel $WHEEL is not tagged cp39-abi3 (one wheel for CPython 3.9+)" ;;
esac
"$PYTHON" "$REPO_ROOT/python/tests/check_stubs.py" || die "python/pcieipc/_native.pyi does not match the module"
# torch and torchrun leave files in the temporary directory (torchelastic_*,
# tmp*/_remote_module_non_scriptable.py); they go with this run's own one.
TMPDIR="$(mktemp -d)"
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT
# From tests/, not python/: `python -m` puts the working directory first on
# sys.path, and python/pcieipc (the sources, without the extension) would
# shadow the installed wheel in the tests' own process.
cd "$REPO_ROOT/python/tests"
"$PYTHON" -m pytest -q -p no:cacheprovider .
