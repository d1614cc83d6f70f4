# The engine's link facts take the kernel's tracepoints too, where a job asks
# for them (PCIEIPC_LINK_TRACEFS): a correctable error that rank 1's root port
# reports reaches no driver below the port, so the module never sees it; the
# ras:aer_event tracepoint does. engine-aer.toml: rank r uses ivs r below its
# own 16 GT/s x16 root port (1 MiB chunks while healthy). Every run is a
# checked sweep (-c 2: every call); the last column is the chunk of the row's last call.
check "insmod pcieipc.ko" insmod /lib/modules/pcieipc.ko

# sweep_with_error OUT: a checked 1 MiB..16 MiB sweep on 2 ranks, a
# correctable Bad TLP injected on rp2 (ivs1's port) after the first row.
sweep_with_error() {
    inject_mid_sweep "$1" rp2 BAD_TLP --transport pcieipc --nranks 2 -b 1M -e 16M -f 2 -n 5 -w 1 -c 2
}
# chunks OUT FIRST LAST: 5 rows, no wrong element, the first row's chunk
# FIRST and the last row's LAST.
chunks() {
    awk -v first="$2" -v last="$3" '!/^#/ && NF == 14 {
            rows++; if ($9 != 0 || $13 != 0) bad++; chunk[rows] = $14 }
        END { exit !(rows == 5 && !bad && chunk[1] == first && chunk[5] == last) }' "$1"
}

unset PCIEIPC_LINK_TRACEFS
without() { sweep_with_error /tmp/without.out && chunks /tmp/without.out 1048576 1048576; }
check "without PCIEIPC_LINK_TRACEFS: the correctable error on rank 1's port goes unseen, 1 MiB chunks throughout, exact" without
check "the module had no AER event for it" [ "$(pcieipc monitor --no-wait --json | grep -c '"kind":"aer"')" = 0 ]
with() { export PCIEIPC_LINK_TRACEFS=1; sweep_with_error /tmp/with.out && chunks /tmp/with.out 1048576 262144; }
check "with PCIEIPC_LINK_TRACEFS=1: rank 1 sees it through ras:aer_event, both ranks move from 1 MiB to 256 KiB chunks, exact" with
# The AER action matrix (docs/fault-path.md): a correctable error costs the
# calls nothing but the smaller chunk. Rank 1 acted on it between two calls,
# the call in flight untouched, and its stall (the time it spent on the
# fault before its next call) is bookkeeping: under a millisecond.
correctable_stall() {
    grep "^# rank" /tmp/with.out
    grep -q "^# rank 1 fault [a-z]* call [0-9]*: 0000:00:11.0 Bad TLP \[6\] correctable: smaller chunk, stall [0-9]* us$" /tmp/with.out &&
        [ "$(grep -c "^# rank .* fault " /tmp/with.out)" = 1 ] &&
        stall_us=$(sed -n 's/^# rank 1 fault .*, stall \([0-9]*\) us$/\1/p' /tmp/with.out) &&
        [ "$stall_us" -lt 1000 ]
}
check "the correctable error's action: rank 1 alone, smaller chunk, a stall under 1 ms" correctable_stall
grep "^# rank" /tmp/with.out
# The rows' times without and with the error (us, out-of-place and in-place):
# the error's row is not held up by a wait.
paste /tmp/without.out /tmp/with.out | awk -F'\t' '$1 !~ /^#/ && $2 !~ /^#/ {
    split($1, a, " "); split($2, b, " ")
    if (length(a) == 14 && length(b) == 14)
        printf "%9d B: without %9.2f %9.2f, with %9.2f %9.2f\n", a[1], a[6], a[10], b[6], b[10] }'
check "the ranks removed their tracing instances" [ -z "$(ls /sys/kernel/tracing/instances)" ]
check "a job asking for tracefs where there is none fails, naming the variable and the path" sh -c '
    ! PCIEIPC_LINK_TRACEFS=/nonexistent pcieipc bench --transport pcieipc --nranks 2 -b 1M -e 1M -n 1 -w 0 > /tmp/bad.out 2>&1 &&
    grep -q "PCIEIPC_LINK_TRACEFS: /nonexistent: tracefs is not mounted there" /tmp/bad.out'
check "rmmod pcieipc" rmmod pcieipc
summary
