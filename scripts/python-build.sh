#!/usr/bin/env bash
# Builds the Python package's wheel, the one `make dist` ships
# (scripts/build-dist.sh wheel: manylinux, with the pcieipc command), and
# installs it into build/python-site, which PYTHONPATH names for the tests
# and the examples. Prints PYTHON=… (the tests' interpreter, with torch),
# WHEEL=… and PYTHONPATH=….
source "$(dirname "$0")/common.sh"
PYTHON="$(bash "$REPO_ROOT/scripts/setup-python.sh" | sed -n 's/^PYTHON=//p')"
[ -x "$PYTHON" ] || die "scripts/setup-python.sh did not report its interpreter"
wheel="$(bash "$REPO_ROOT/scripts/build-dist.sh" wheel | sed -n 's/^WHEEL=//p')"
[ -f "$wheel" ] || die "scripts/build-dist.sh made no wheel"
rm -rf "$REPO_ROOT/build/python-site"
"$(dirname "$PYTHON")/pip" install --quiet --disable-pip-version-check --no-deps --target "$REPO_ROOT/build/python-site" \
    "$wheel" || die "installing the wheel into build/python-site failed"
echo "PYTHON=$PYTHON"
echo "WHEEL=$wheel"
echo "PYTHONPATH=$REPO_ROOT/build/python-site"
