#!/usr/bin/env bash
# Builds the Python package's wheel (maturin, release) into build/wheels and
# installs it into build/python-site, which PYTHONPATH names for the tests,
# the examples and the GPU machine. Prints PYTHON=… and PYTHONPATH=….
source "$(dirname "$0")/common.sh"
PYTHON="$(bash "$REPO_ROOT/scripts/setup-python.sh" | sed -n 's/^PYTHON=//p')"
[ -x "$PYTHON" ] || die "scripts/setup-python.sh did not report its interpreter"
bin="$(dirname "$PYTHON")"
rm -f "$REPO_ROOT"/build/wheels/pcieipc-*.whl
(cd "$REPO_ROOT/python" && "$bin/maturin" build --release --quiet --interpreter "$PYTHON" -o "$REPO_ROOT/build/wheels" >&2) ||
    die "maturin build failed (python/)"
rm -rf "$REPO_ROOT/build/python-site"
"$bin/pip" install --quiet --disable-pip-version-check --no-deps --target "$REPO_ROOT/build/python-site" \
    "$REPO_ROOT"/build/wheels/pcieipc-*.whl || die "installing the wheel into build/python-site failed"
echo "PYTHON=$PYTHON"
echo "PYTHONPATH=$REPO_ROOT/build/python-site"
