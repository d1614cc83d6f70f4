# Surprise removal (docs/fault-path.md): a rank's device hot-unplugged while
# three ranks run a checked all-reduce sweep over the pcieipc transport
# (engine-removal.toml: ivs0 below its own root port, ivs1 and ivs2 behind a
# switch, ivs3 behind another beside a driverless pci-testdev; rank r takes
# the r-th bound device). The module maps its stand-in page where the removed
# device's window was, so no rank dies of SIGBUS; the rank that lost its
# device reads DEVICE_GONE, and so do the others, who learn from the device
# each rank published whose it was. Every rank must end within 20 s of the
# unplug request (pciehp's button takes 5 s of it), naming the device as
# removed; none killed by a signal; no wrong element in any row; nothing left
# behind. Then the fatal-error path that shares it: a fatal error the kernel
# cannot recover from (the testdev has no error handler) gives rank 1's
# device up; both ranks name it, the bit and the failed recovery.
check "insmod pcieipc.ko" insmod /lib/modules/pcieipc.ko
check "4 ivshmem-doorbell devices bound" sh -c '
    [ "$(pcieipc device list | grep -c "1af4:1110 Ivshmem Bound")" = 4 ]'
pcieipc device list
# bdf_of INDEX: the BDF of bound device INDEX.
bdf_of() { pcieipc device list | awk -v i="$1" '$1 == i { print $2 }'; }
ivs0=$(bdf_of 0)
ivs2=$(bdf_of 2)

# removed_mid_sweep OUT DEVICE-ID BDF: the sweep, DEVICE-ID unplugged once
# the 256 KiB row is out; passes if the job failed within 20 s of the
# request and every rank named BDF as removed (every_rank_named).
removed_mid_sweep() {
    act_mid_sweep "$1" 262144 "host unplug $2" --transport pcieipc --nranks 3 --chunk-bytes 64K \
        -b 256K -e 1M -f 2 -n 300 -w 1 -c 2 && rc=0 || rc=$?
    echo "$2 ($3): the job exited with $rc, $ACTED_MS ms after the unplug request (the request took $ACTION_MS ms)" | tee -a /tmp/removals
    [ "$rc" != 0 ] && [ "$rc" != 99 ] && [ "$ACTED_MS" -lt 20000 ] &&
        every_rank_named "$1" 3 "rank [0-2]: device $3 was removed (DEVICE_GONE"
}

check "rank 2's device ($ivs2, behind the switch) unplugged mid-sweep: all 3 ranks fail within 20 s naming it, none by a signal" \
    removed_mid_sweep /tmp/rank2.out ivs2 "$ivs2"
# ivs2 is gone: the ranks now take ivs0, ivs1, ivs3.
check "rank 0's device ($ivs0, below its own root port) unplugged mid-sweep: the same" \
    removed_mid_sweep /tmp/rank0.out ivs0 "$ivs0"
cat /tmp/removals
grep -h "error" /tmp/rank2.out /tmp/rank0.out

check "the module lists both as gone, the other two still bound" sh -c '
    [ "$(pcieipc device list | grep -c "1af4:1110 Ivshmem Gone")" = 2 ] &&
    [ "$(pcieipc device list | grep -c "1af4:1110 Ivshmem Bound")" = 2 ]'
check "nothing left behind: no rank running, no shared memory, no watch" sh -c '
    ! pidof pcieipc && [ -z "$(ls /dev/shm)" ] &&
    for bdf in $(pcieipc device list | awk "\$2 ~ /:/ { print \$2 }"); do
        ! pcieipc link unwatch $bdf 2>/tmp/e && grep -q ENOENT /tmp/e || { cat /tmp/e; exit 1; }
    done'
check "3 ranks on the two devices left: refused at once, rank 2 says so" sh -c '
    ! timeout 20 pcieipc bench --transport pcieipc --nranks 3 --chunk-bytes 64K -b 8 -e 8 > /tmp/few.out 2>&1 &&
    grep -q "rank 2: pcieipc transport" /tmp/few.out'
cat /tmp/few.out
check "2 ranks on the devices left: every call exact" sh -c '
    pcieipc bench --transport pcieipc --nranks 2 --chunk-bytes 64K -b 256K -e 1M -f 2 -n 5 -w 1 -c 2 > /tmp/after.out 2>&1 &&
    awk "!/^#/ && NF == 14 { rows++; if (\$9 != 0 || \$13 != 0) bad++ } END { exit !(rows == 3 && !bad) }" /tmp/after.out'
cat /tmp/after.out

# The two ranks now take ivs1 and ivs3 (rank 1, below rp3 with the testdev).
ivs3=$(bdf_of 3)
given_up() {
    act_mid_sweep /tmp/given-up.out 262144 "inject rp3 MALF_TLP" --transport pcieipc --nranks 2 \
        --chunk-bytes 64K -b 256K -e 1M -f 2 -n 300 -w 1 -c 2 && rc=0 || rc=$?
    echo "MALF_TLP on rp3: the job exited with $rc, $ACTED_MS ms after the injection (its request took $ACTION_MS ms)" | tee -a /tmp/removals
    [ "$rc" != 0 ] && [ "$rc" != 99 ] && [ "$ACTED_MS" -lt 20000 ] &&
        every_rank_named /tmp/given-up.out 2 \
            "rank 1: device $ivs3 reported .*Malformed TLP \[18\] fatal.*; the kernel's recovery: failed (permanent failure)"
}
check "a fatal error below rp3 the kernel gives up on: both ranks fail within 20 s naming rank 1's device ($ivs3), the bit and the failed recovery, neither by a signal" given_up
grep -h "MALF_TLP" /tmp/removals; grep -h "error" /tmp/given-up.out
pcieipc monitor --no-wait | tail -6
check "the kernel gave ivs3 up: a permanent failure, then DEVICE_GONE, and the module lists it gone" sh -c '
    pcieipc monitor --no-wait --json > /tmp/given-up.json
    grep "\"bdf\":\"'"$ivs3"'\"" /tmp/given-up.json | grep -q "\"channel_state\":\"permanent_failure\"" &&
    grep -q "\"kind\":\"device_gone\",\"bdf\":\"'"$ivs3"'\"" /tmp/given-up.json &&
    pcieipc device list | grep -q "^3 '"$ivs3"' 1af4:1110 Ivshmem Gone"'
check "rmmod pcieipc" rmmod pcieipc
check "kernel log: no Oops, BUG or WARNING" sh -c '! dmesg | grep -E "Oops|BUG|WARNING|general protection"'
summary
