# The data path between two ivshmem-doorbell devices of one region
# (datapath.toml): BAR windows, the 10,000-round ping-pong between two
# processes, WAIT's timeout / signal / CPU-time contract, two waiters on one
# vector, and unbind waking a blocked waiter.
check "insmod pcieipc.ko" insmod /lib/modules/pcieipc.ko
# Each measuring check keeps its output in /tmp/NAME.out, printed after it
# (check shows output only on failure): the numbers go to the run's log.
measure() {
    name="$1"; desc="$2"; shift 2
    check "$desc" sh -c '"$@" > "/tmp/$0.out" 2>&1' "$name" "$@"
    cat "/tmp/$name.out"
}
measure mmap "mmap: both devices' BAR2 windows are one memory; bad windows refused (EINVAL/ENOENT)" \
    pcieipc-guest mmap-checks
measure pingpong "ping-pong: 10,000 round trips between 2 processes, every pattern verified" \
    pcieipc-guest ping-pong --members 2 --rounds 10000
measure timeout "WAIT with a 200 ms timeout: ETIMEDOUT after 100..300 ms; 0 ms does not block" \
    pcieipc-guest wait-timeout --timeout-ms 200
measure eintr "WAIT without a limit: a signal ends it with EINTR" pcieipc-guest wait-eintr
measure cputime "CPU time of a process blocked 2 s in WAIT is under 5% of a spinning reader's" \
    pcieipc-guest cpu-time --ms 2000
peer1=$(pcieipc device list | awk '$1 == 1 {print $NF}')
check "two processes waiting on vector 1 of device 1 both wake on one RING, with the same count" sh -c "
    base=\$(pcieipc device counters 1 | awk '{print \$2}')
    pcieipc device wait 1 1 --last-seen \$base --timeout-ms 5000 > /tmp/w1 &
    a=\$!
    pcieipc device wait 1 1 --last-seen \$base --timeout-ms 5000 > /tmp/w2 &
    b=\$!
    sleep 0.5
    pcieipc device ring 0 $peer1 1 && wait \$a && wait \$b &&
    [ \"\$(cat /tmp/w1)\" = \$((base + 1)) ] && [ \"\$(cat /tmp/w2)\" = \$((base + 1)) ]"
check "rmmod is refused (EBUSY) while a process waits; the wait goes on" sh -c '
    pcieipc device wait 1 1 --last-seen 1000000 --timeout-ms 3000 2>/tmp/busy &
    w=$!
    sleep 0.5
    ! rmmod pcieipc 2>/dev/null && grep -q "^pcieipc " /proc/modules &&
    ! wait $w && grep -q "timed out" /tmp/busy'
check "unbinding the device zaps its BAR windows: a process touching its window afterwards gets the module's stand-in page (no SIGBUS), its write reaches no device, after DEVICE_GONE" sh -c '
    pcieipc-guest mmap-touch --device 1 --witness 0 --ready /tmp/ready --go /tmp/go > /tmp/touch.out 2>&1 &
    t=$!
    for i in $(seq 100); do [ -e /tmp/ready ] && break; sleep 0.05; done
    echo 0000:02:00.0 > /sys/bus/pci/drivers/pcieipc/unbind && touch /tmp/go
    wait $t; rc=$?; cat /tmp/touch.out; echo "exit status $rc"
    pcieipc monitor --no-wait --json > /tmp/unbind.json
    [ $rc = 0 ] && grep -q "\"kind\":\"device_gone\",\"bdf\":\"0000:02:00.0\"" /tmp/unbind.json &&
        echo 0000:02:00.0 > /sys/bus/pci/drivers/pcieipc/bind'
check "unbinding the device wakes a process blocked without a limit: ENODEV" sh -c '
    start=$(date +%s)
    index=$(pcieipc device list | awk "\$2 == \"0000:02:00.0\" && \$5 == \"Bound\" {print \$1}")
    pcieipc device wait "$index" 1 --last-seen 1000000 2>/tmp/gone &
    w=$!
    sleep 0.5
    echo 0000:02:00.0 > /sys/bus/pci/drivers/pcieipc/unbind
    ! wait $w && cat /tmp/gone && grep -q ENODEV /tmp/gone && [ $(( $(date +%s) - start )) -lt 5 ]'
gone=$(pcieipc device list | awk '$2 == "0000:02:00.0" && $5 == "Gone" {print $1}')
measure gone "the gone device (index $gone): its BAR2 can no longer be mapped (ENODEV)" \
    pcieipc-guest mmap-gone --device "$gone"
check "rebinding brings the device back under a new index" sh -c '
    echo 0000:02:00.0 > /sys/bus/pci/drivers/pcieipc/bind &&
    pcieipc device list | grep -q "^[0-9]* 0000:02:00.0 1af4:1110 Ivshmem Bound"'
check "hot-unplug of ivs1 (QMP device_del) wakes a process blocked on it: ENODEV" sh -c '
    index=$(pcieipc device list | awk "\$2 == \"0000:02:00.0\" && \$5 == \"Bound\" {print \$1}")
    pcieipc device wait "$index" 0 --last-seen 1000000 2>/tmp/unplugged &
    w=$!
    sleep 0.5
    host unplug ivs1 &&
    ! wait $w && cat /tmp/unplugged && grep -q ENODEV /tmp/unplugged &&
    pcieipc device list | grep -q "^$index 0000:02:00.0 1af4:1110 Ivshmem Gone"'
check "rmmod pcieipc once every file is closed" rmmod pcieipc
summary
