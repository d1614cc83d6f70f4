# The AER action matrix on the shm transport, for devices the module does not
# bind (a GPU or NIC with its vendor driver, in production): each rank names
# the function its data crosses (--link-of) and, with PCIEIPC_LINK_TRACEFS,
# follows its errors and link through the kernel's tracepoints
# (engine-aer.toml, the module not loaded: ivs0 0000:01:00.0 below rp1,
# ivs1 0000:02:00.0 below rp2 00:11.0; rank r names ivs r). Every run is a
# checked sweep (-c 2: every call); the last column is the chunk of the row's last call.
export PCIEIPC_LINK_TRACEFS=1
check "the module is not loaded: ivs0 and ivs1 have no driver" sh -c '
    ! grep -q "^pcieipc " /proc/modules &&
    [ ! -e /sys/bus/pci/devices/0000:01:00.0/driver ] && [ ! -e /sys/bus/pci/devices/0000:02:00.0/driver ]'

# sweep OUT ERROR: a checked 1 MiB..16 MiB sweep on 2 shm ranks, ERROR
# injected on rp2 once the first row is out; prints how long the job ran on
# after the injection.
sweep() {
    inject_mid_sweep "$1" rp2 "$2" --nranks 2 -b 1M -e 16M -f 2 -n 5 -w 1 -c 2 \
        --link-of 0000:01:00.0,0000:02:00.0 && rc=0 || rc=$?
    echo "$2: the job exited with $rc, $INJECTED_MS ms after the injection" | tee -a /tmp/stalls
    return $rc
}
# exact OUT FIRST [LAST]: 5 rows, no wrong element, the first row's chunk
# FIRST and (if given) the last row's LAST.
exact() {
    awk -v first="$2" -v last="${3:-any}" '!/^#/ && NF == 14 {
            rows++; if ($9 != 0 || $13 != 0) bad++; chunk[rows] = $14 }
        END { exit !(rows == 5 && !bad && chunk[1] == first && (last == "any" || chunk[5] == last)) }' "$1"
}
# fault OUT PATTERN: rank 1 alone recorded one fault, matching PATTERN.
fault() {
    grep "^# rank" "$1"
    grep -q "^# rank 1 fault [a-z]* call [0-9]*: $2" "$1" && [ "$(grep -c "^# rank .* fault " "$1")" = 1 ]
}

correctable() {
    sweep /tmp/cor.out BAD_TLP && exact /tmp/cor.out 1048576 262144 &&
        fault /tmp/cor.out "0000:00:11.0 Bad TLP \[6\] correctable: smaller chunk, stall [0-9]* us$"
}
check "correctable Bad TLP on rank 1's root port: seen through ras:aer_event, smaller chunk for both ranks, exact" correctable
non_fatal() {
    sweep /tmp/nonfatal.out COMP_TIME && exact /tmp/nonfatal.out 1048576 &&
        fault /tmp/nonfatal.out "0000:0[02]:[01][01].0 .*Completion Timeout \[14\] non-fatal: await recovery, recovery answering again (config reads, link up), stall [0-9]* us$"
}
check "non-fatal Completion Timeout: rank 1 waited until the device answered again, then went on, exact" non_fatal
fatal() {
    ! sweep /tmp/fatal.out MALF_TLP &&
        [ "$(grep -c "rank 1: device 0000:0[02]:[01][01].0 reported .*Malformed TLP \[18\] fatal.*; the kernel's recovery: answering again" /tmp/fatal.out)" = 2 ] &&
        awk '!/^#/ && NF == 14 && ($9 != 0 || $13 != 0) { bad++ } END { exit bad }' /tmp/fatal.out &&
        [ "$(sed -n 's/^MALF_TLP: the job exited with [0-9]*, \([0-9]*\) ms after the injection$/\1/p' /tmp/stalls)" -lt 15000 ]
}
check "fatal Malformed TLP: both ranks fail within 15 s, naming the device and the bit, no wrong element" fatal
cat /tmp/stalls
check "the ranks removed their tracing instances" [ -z "$(ls /sys/kernel/tracing/instances)" ]
unset PCIEIPC_LINK_TRACEFS
# (rp2's link now reads 2.5 GT/s x1, as QEMU leaves it after the fatal error:
# the sweep starts from the chunk for that and keeps it.)
unfollowed() {
    sweep /tmp/off.out BAD_TLP && ! grep -q "^# rank .* fault " /tmp/off.out &&
        exact /tmp/off.out "$(awk '!/^#/ && NF == 14 { print $14; exit }' /tmp/off.out)" \
            "$(awk '!/^#/ && NF == 14 { print $14; exit }' /tmp/off.out)"
}
check "without PCIEIPC_LINK_TRACEFS the device is not followed: the same error changes no chunk and records no fault, exact" unfollowed

# Surprise removal of a followed device (a GPU falling off the bus): rank 0's
# ivs0 is hot-unplugged mid-sweep. The rank sees its followed function gone
# from sysfs and fails; the shm segment is intact, so its record reaches
# rank 1. Both must end within 20 s of the request (pciehp's button takes 5 s
# of it), naming the device as removed, neither by a signal, no wrong element.
export PCIEIPC_LINK_TRACEFS=1
removed() {
    act_mid_sweep /tmp/removed.out 1048576 "host unplug ivs0" --nranks 2 -b 1M -e 16M -f 2 -n 40 -w 1 -c 2 \
        --link-of 0000:01:00.0,0000:02:00.0 && rc=0 || rc=$?
    echo "ivs0 unplugged: the job exited with $rc, $ACTED_MS ms after the request" | tee -a /tmp/stalls
    [ "$rc" != 0 ] && [ "$rc" != 99 ] && [ "$ACTED_MS" -lt 20000 ] &&
        every_rank_named /tmp/removed.out 2 "rank 0: device 0000:01:00.0 was removed (DEVICE_GONE"
}
check "rank 0's followed device unplugged mid-sweep: both ranks fail within 20 s naming it as removed, neither by a signal" removed
grep -h "ivs0 unplugged" /tmp/stalls; grep -h "error" /tmp/removed.out
check "nothing left behind: no tracing instance, no shared memory, no rank running" sh -c '
    [ -z "$(ls /sys/kernel/tracing/instances)" ] && [ -z "$(ls /dev/shm)" ] && ! pidof pcieipc'
summary
