# PCI error recovery (datapath.toml): an uncorrectable error injected on rp1
# reaches pcieipc's error handlers for ivs0 below it: a process waiting on
# ivs0 fails with EIO, recovery brings ivs0 back, and ivs1 (below rp2) is
# not disturbed.
check "insmod pcieipc.ko" insmod /lib/modules/pcieipc.ko
peer0=$(pcieipc device list | awk '$1 == 0 {print $NF}')
check "an AER error on rp1 fails the wait on ivs0 with EIO; the wait on ivs1 runs to its timeout" sh -c '
    pcieipc device wait 0 1 --last-seen 1000000 2>/tmp/ivs0 &
    a=$!
    pcieipc device wait 1 1 --last-seen 1000000 --timeout-ms 3000 2>/tmp/ivs1 &
    b=$!
    sleep 0.5
    inject rp1 COMP_TIME || exit 1
    ! wait $a; failed0=$?; cat /tmp/ivs0
    ! wait $b; failed1=$?; cat /tmp/ivs1
    [ "$failed0" = 0 ] && grep -q EIO /tmp/ivs0 && [ "$failed1" = 0 ] && grep -q "timed out" /tmp/ivs1'
check "recovery resumed ivs0: bound again, and its doorbell vector still counts" sh -c "
    dmesg | grep -i 'AER\|recover' | tail -5
    pcieipc device list | grep -q '^0 0000:01:00.0 1af4:1110 Ivshmem Bound' &&
    base=\$(pcieipc device counters 0 | awk '{print \$2}') &&
    pcieipc device ring 1 $peer0 1 &&
    [ \"\$(pcieipc device wait 0 1 --last-seen \$base --timeout-ms 2000)\" = \$((base + 1)) ]"
check "rmmod pcieipc" rmmod pcieipc
summary
