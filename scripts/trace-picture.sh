#!/usr/bin/env bash
# The trace picture of docs/cli.md: a 2-rank shm bench of 1 MiB all_reduce traced
# (`pcieipc trace`), its last two 1 MiB calls drawn (`pcieipc trace svg`) and
# rendered by headless Chromium into docs/trace.png.
#
#   scripts/trace-picture.sh [OUT.png]
source "$(dirname "$0")/common.sh"
cd "$REPO_ROOT"

out="${1:-docs/trace.png}"
command -v chromium >/dev/null || die "chromium is not installed (scripts/setup-host.sh installs it)"
cargo build --release -q -p pcieipc-cli
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
target/release/pcieipc trace -o "$work/trace.json" -- \
    target/release/pcieipc bench --nranks 2 -b 1M -e 1M -n 2 -w 1 > "$work/summary.txt"
target/release/pcieipc trace -o "$work/trace.svg" --calls 2 svg "$work/trace.json"
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1200,330 \
    --screenshot="$work/trace.png" "file://$work/trace.svg" > "$work/chromium.log" 2>&1 ||
    die "chromium could not render the timeline: $(tail -3 "$work/chromium.log")"
cp "$work/trace.png" "$out"
cat "$work/summary.txt"
log "wrote $out"
