# A fatal AER error on a rank's link fails every rank of a running all_reduce
# within a bounded time, each naming the device, the error bits and the
# kernel's recovery result, never a hang and never a wrong result (the AER
# action matrix, docs/fault-path.md). engine-aer.toml: rank r uses ivs r below
# its own root port; the error is injected on rp2 (ivs1's port) once the first
# row of a checked 1 MiB..16 MiB sweep is out.
check "insmod pcieipc.ko" insmod /lib/modules/pcieipc.ko

# fatal_mid_sweep OUT ERROR: the sweep, ERROR injected on rp2 after its first
# row; prints how long the job ran on after the injection, and fails unless
# the job failed within 15 s (the recovery wait, 10 s at most, and the peers'
# 10 ms sleep slices).
fatal_mid_sweep() {
    inject_mid_sweep "$1" rp2 "$2" --transport pcieipc --nranks 2 -b 1M -e 16M -f 2 -n 5 -w 1 -c 2 && rc=0 || rc=$?
    echo "$2: the job exited with $rc, $INJECTED_MS ms after the injection" | tee -a /tmp/stalls
    [ "$rc" != 0 ] && [ "$INJECTED_MS" -lt 15000 ]
}
# named OUT TEXT: both ranks' errors carry TEXT, and no row has a wrong element.
named() {
    [ "$(grep -c "$2" "$1")" = 2 ] &&
        awk '!/^#/ && NF == 14 && ($9 != 0 || $13 != 0) { bad++ } END { exit bad }' "$1"
}

fatal() {
    fatal_mid_sweep /tmp/fatal.out MALF_TLP &&
        named /tmp/fatal.out "rank 1: device 0000:02:00.0 reported Malformed TLP \[18\] fatal; the kernel's recovery: recovered (resume)"
}
check "Malformed TLP (fatal) on rank 1's link mid-sweep: both ranks fail within 15 s, naming ivs1, the bit and the recovery" fatal
surprise_down() {
    fatal_mid_sweep /tmp/sdn.out SDN &&
        named /tmp/sdn.out "rank 1: device 0000:02:00.0 reported .*Surprise Down Error \[5\] fatal.*; the kernel's recovery: recovered (resume)"
}
check "Surprise Down on rank 1's link mid-sweep, ivs1 recovered from the first: both ranks fail within 15 s, naming it" surprise_down
cat /tmp/stalls
grep -h "error:" /tmp/fatal.out /tmp/sdn.out
check "the kernel recovered ivs1 with a reset (error_detected frozen, slot_reset, resume)" sh -c '
    events=$(pcieipc monitor --no-wait --json | grep "\"bdf\":\"0000:02:00.0\"" | grep "\"kind\":\"aer\"") &&
    echo "$events" | grep "\"aer_step\":\"error_detected\"" | grep -q "\"channel_state\":\"frozen\"" &&
    echo "$events" | grep -q "\"aer_step\":\"slot_reset\"" &&
    echo "$events" | grep -q "\"aer_step\":\"resume\""'
check "the ranks removed their watches: unwatch finds none (ENOENT)" sh -c '
    ! pcieipc link unwatch 0000:02:00.0 2>/tmp/e && grep -q ENOENT /tmp/e'
check "rmmod pcieipc" rmmod pcieipc
summary
