# The AllReduce engine re-plans its chunk size when AER and link events
# arrive (engine-aer.toml): rank r uses ivs r, each below its own 16 GT/s x16
# root port, so the default policy starts with 1 MiB chunks. Every run is a
# checked sweep (`-c 2`: every element of every rank, in every call, exact) during which an
# error is injected once its first row is out; the last column is the chunk
# size of the row's last call.
#
# QEMU resets a root port's link registers to 2.5 GT/s x1 on every
# uncorrectable error injected there, which a watch on the link reports as a
# LINK_CHANGE shortly after the AER event. The first run watches ivs1's link
# itself with a 60 s period (the engine then uses that watch), so only the
# AER event reaches the engine within the run; the second lets the engine's
# own 100 ms watch see the link fall to 2.5 GT/s.
check "insmod pcieipc.ko" insmod /lib/modules/pcieipc.ko
check "2 ivshmem-doorbell devices bound, each on a 16 GT/s x16 link" sh -c '
    [ "$(pcieipc device list | grep -c "1af4:1110 Ivshmem Bound 1 Msix vector(s), 16 GT/s x16")" = 2 ]'

# sweep_with_error OUT NRANKS PORT: a checked 1 MiB..16 MiB sweep, an
# uncorrectable error injected on PORT after the first row.
sweep_with_error() {
    inject_mid_sweep "$1" "$3" COMP_TIME --transport pcieipc --nranks "$2" -b 1M -e 16M -f 2 -n 5 -w 1 -c 2
}
# chunks OUT FIRST LAST: 5 rows, no wrong element, the first row's chunk
# FIRST and the last row's LAST.
chunks() {
    awk -v first="$2" -v last="$3" '!/^#/ && NF == 14 {
            rows++; if ($9 != 0 || $13 != 0) bad++; chunk[rows] = $14 }
        END { exit !(rows == 5 && !bad && chunk[1] == first && chunk[5] == last) }' "$1"
}

aer_on_rank_1_link() {
    pcieipc link watch 0000:02:00.0 --period-ms 60000 &&
    sweep_with_error /tmp/aer.out 2 rp2 && chunks /tmp/aer.out 1048576 262144
}
check "AER error on rank 1's link mid-sweep: rank 0 moves both ranks from 1 MiB to 256 KiB chunks, exact" \
    aer_on_rank_1_link
# The AER action matrix (docs/fault-path.md): a non-fatal error stops the
# rank before its next call until the kernel's recovery ends (resume); the
# stall is that wait, measured by the rank.
non_fatal_action() {
    grep "^# rank" /tmp/aer.out
    grep -q "^# rank 1 fault [a-z]* call [0-9]*: 0000:02:00.0 Completion Timeout \[14\] non-fatal: await recovery, recovery recovered (resume), stall [0-9]* us$" /tmp/aer.out &&
        [ "$(grep -c "^# rank .* fault " /tmp/aer.out)" = 1 ] &&
        stall_us=$(sed -n 's/^# rank 1 fault .*, stall \([0-9]*\) us$/\1/p' /tmp/aer.out) &&
        [ "$stall_us" -lt 10000000 ]
}
check "the non-fatal error's action: rank 1 alone awaited the kernel's recovery (resume), then went on" non_fatal_action
grep "^# rank" /tmp/aer.out
check "the AER event names ivs1 (02:00.0), from rp2" sh -c '
    pcieipc monitor --no-wait --json | grep "\"aer_step\":\"error_detected\"" |
        grep "\"bdf\":\"0000:02:00.0\"" | grep -q "\"aer_source\":\"0000:00:11.0\""'
check "a new job starts from ivs1's link as it reads now (2.5 GT/s x1): 64 KiB chunks" sh -c '
    pcieipc link unwatch 0000:02:00.0 &&
    pcieipc link status 0000:02:00.0 | grep -q "2.5GT/s x1" &&
    pcieipc bench --transport pcieipc --nranks 2 -b 1M -e 1M -n 2 -w 0 -c 2 > /tmp/slow.out 2>&1 &&
    cat /tmp/slow.out &&
    awk "!/^#/ && NF == 14 { rows++; if (\$9 != 0 || \$13 != 0 || \$14 != 65536) bad++ }
        END { exit !(rows == 1 && !bad) }" /tmp/slow.out'
# Chunk checksums (docs/fault-path.md): on this transport every chunk carries
# one, checked on receipt. QEMU's injected errors damage no data, so in this
# sweep each rank also damages the 40th chunk it sends (--damage-chunk: the
# slot's data after the checksum, as a write damaged on the link would be)
# while a non-fatal error is injected on rank 1's link: each receiver reads the
# chunk again, has it resent, and every element of the sweep is exact.
resend_damaged() {
    inject_mid_sweep /tmp/resend.out rp2 COMP_TIME --transport pcieipc --nranks 2 \
        -b 1M -e 16M -f 2 -n 5 -w 1 -c 2 --damage-chunk 40 &&
    awk '!/^#/ && NF == 14 { rows++; if ($9 != 0 || $13 != 0) bad++ }
        END { exit !(rows == 5 && !bad) }' /tmp/resend.out &&
    for pair in "0 1" "1 0"; do
        set -- $pair
        grep -q "^# rank $1 resend in call [0-9]*: message [0-9]* of rank $2's r[a-z]* slot failed its checksum; whole on read 3 (1 resend), stall [0-9]* us$" /tmp/resend.out || return 1
    done &&
    grep -q "^# rank 1 fault [a-z]* call [0-9]*: 0000:02:00.0 Completion Timeout \[14\] non-fatal: await recovery, recovery recovered (resume)" /tmp/resend.out
}
check "a non-fatal error mid-sweep and a damaged chunk from each rank: re-read, resent once, exact" resend_damaged
grep "^# rank" /tmp/resend.out
stays_damaged() {
    ! pcieipc bench --transport pcieipc --nranks 2 -b 1M -e 1M -n 2 -w 0 -c 2 \
        --damage-chunk 3x9 > /tmp/damaged.out 2>&1
    cat /tmp/damaged.out
    [ "$(grep -c "^pcieipc: error: rank [01]: message [0-9]* in rank [01]'s r[a-z]* slot failed its checksum on all 5 reads" /tmp/damaged.out)" = 2 ]
}
check "a chunk damaged on every write: both ranks fail naming it (5 reads), no wrong result, no hang" stays_damaged
grep "^pcieipc: error" /tmp/damaged.out
error_on_own_link() {
    sweep_with_error /tmp/link.out 1 rp1 && chunks /tmp/link.out 1048576 65536
}
check "error on rank 0's own link mid-sweep, its engine watching: 1 MiB, then 64 KiB once the link reads 2.5 GT/s" \
    error_on_own_link
check "the engines removed the watches they added: unwatch finds none (ENOENT)" sh -c '
    ! pcieipc link unwatch 0000:01:00.0 2>/tmp/e && grep -q ENOENT /tmp/e'
pcieipc monitor --no-wait --json | cut -c1-160
check "rmmod pcieipc" rmmod pcieipc
summary
