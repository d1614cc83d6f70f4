#!/bin/sh
# DKMS pre-build hook of pcieipc: a Rust module builds only against headers
# that carry the kernel's Rust artifacts. When they lack them, prepare them
# (pcieipc-prepare-kernel-rust: the kernel's source and its exact toolchain,
# a few minutes), so that a new kernel gets its module like any other DKMS
# module; when that cannot be done, name what is missing and the way out
# instead of failing deep inside rustc or kbuild.
# Argument: the kernel release DKMS builds for.
set -eu
release="$1"
pcieipc-prepare-kernel-rust --check "$release" >/dev/null 2>&1 && exit 0
echo "pcieipc: the headers of $release lack the kernel's Rust artifacts: preparing them (pcieipc-prepare-kernel-rust $release)" >&2
if ! pcieipc-prepare-kernel-rust "$release"; then
    pcieipc-prepare-kernel-rust --check "$release" || true
    echo "pcieipc: cannot build for $release until its headers have the Rust artifacts (see above); then run: dkms install pcieipc/@VERSION@ -k $release" >&2
    exit 1
fi
