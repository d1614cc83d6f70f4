#!/bin/sh
# Measures the probe of a 1,000-device synthetic sysfs tree and the exact ring
# for 16 GPUs (release build) and prints the two medians docs/results.md quotes.
set -eu
cd "$(dirname "$0")/.."
cargo bench -p pcieipc --bench probe_and_ring
