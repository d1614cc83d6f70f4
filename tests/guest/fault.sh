# The fault path on the foundation fabric: link status of owned and unowned
# functions, retraining, the event stream (read, poll, overflow), watches
# with hot-unplug. BDFs: rp1 00:10.0 -> edu 01:00.0; rp2 00:11.0 -> td0
# 02:00.0; rp3 00:12.0 (16 GT/s x16) -> switch 03:00.0 (a 2.5 GT/s x1 device).
insmod /lib/modules/pcieipc.ko

check "edu's link (port 00:10.0): 2.5 GT/s x1 of 2.5 GT/s x1, not degraded" sh -c '
    pcieipc link status 0000:01:00.0 --json > /tmp/l.json && cat /tmp/l.json &&
    grep -q "\"upstream_port\":\"0000:00:10.0\"" /tmp/l.json &&
    grep -q "\"speed\":1,\"width\":1,\"max_speed\":1,\"max_width\":1" /tmp/l.json &&
    grep -q "\"degraded\":false" /tmp/l.json'
check "root port 00:12.0 (capable of 16 GT/s x16, trained to 2.5 GT/s x1) reads back degraded" sh -c '
    pcieipc link status 0000:00:12.0 --json > /tmp/l.json && cat /tmp/l.json &&
    grep -q "\"speed\":1,\"width\":1,\"max_speed\":4,\"max_width\":16" /tmp/l.json &&
    grep -q "\"degraded\":true" /tmp/l.json'
check "pci-testdev (not owned by pcieipc) has a readable link too" sh -c '
    pcieipc link status 0000:02:00.0 | grep -q "0000:02:00.0 (port 0000:00:11.0): 8GT/s x4 of 8GT/s x4"'
check "a function that does not exist: ENODEV" sh -c '
    ! pcieipc link status 0000:09:00.0 2>/tmp/e && grep -q "PCIEIPC_IOC_LINK_STATUS failed: ENODEV" /tmp/e'

check "retrain of edu's link: before/after and a LINK_RETRAIN event" sh -c '
    pcieipc link retrain 0000:01:00.0 --json > /tmp/r.json && cat /tmp/r.json &&
    grep -q "\"completed\":true" /tmp/r.json && grep -q "\"before\":{\"bdf\":\"0000:01:00.0\"" /tmp/r.json &&
    pcieipc monitor --no-wait --json > /tmp/ev.json &&
    grep "\"kind\":\"link_retrain\"" /tmp/ev.json | grep "\"bdf\":\"0000:01:00.0\"" | grep -q "\"result\":\"ok\""'
check "retrain of a root port (no upstream PCIe port) is a clear error" sh -c '
    ! pcieipc link retrain 0000:00:10.0 2>/tmp/e && cat /tmp/e &&
    grep -q "PCIEIPC_IOC_LINK_RETRAIN failed: EOPNOTSUPP" /tmp/e'
check "a target speed above the port's capability is refused" sh -c '
    ! pcieipc link retrain 0000:01:00.0 --speed 4 2>/tmp/e && grep -q EINVAL /tmp/e'
check "retrain with a target speed within the capability" pcieipc link retrain 0000:01:00.0 --speed 1

check "poll: readable exactly when an event is there; EAGAIN; blocked read wakes" \
    pcieipc-fault-check poll --bdf 0000:01:00.0
check "a reader asleep through 10x the ring reads an exact overflow record, then the newest" \
    pcieipc-fault-check overflow --bdf 0000:01:00.0

check "watch the root port 00:11.0 and pci-testdev 02:00.0" sh -c '
    pcieipc link watch 0000:00:11.0 --period-ms 20 && pcieipc link watch 0000:02:00.0 --period-ms 20'
check "a second watch of the same function: EEXIST" sh -c '
    ! pcieipc link watch 0000:02:00.0 2>/tmp/e && grep -q EEXIST /tmp/e'
check "a watch period out of range: EINVAL" sh -c '
    ! pcieipc link watch 0000:00:10.0 --period-ms 1 2>/tmp/e && grep -q EINVAL /tmp/e'
check "hot-unplug of td0: DEVICE_GONE for 02:00.0, LINK_CHANGE (link down) on 00:11.0" sh -c '
    pcieipc monitor --no-wait > /dev/null; host unplug td0 &&
    for i in $(seq 50); do
        pcieipc monitor --no-wait --json >> /tmp/unplug.json
        grep -q "\"kind\":\"device_gone\",\"bdf\":\"0000:02:00.0\"" /tmp/unplug.json &&
            grep "\"kind\":\"link_change\",\"bdf\":\"0000:00:11.0\"" /tmp/unplug.json |
            grep -q "\"link_after\":{[^}]*\"dll_link_active\":false" && exit 0
        sleep 0.1
    done; cat /tmp/unplug.json; exit 1'
check "hot-unplug of bound ivs1 (06:00.0) while a process waits: ENODEV, and a DEVICE_GONE event" sh -c '
    index=$(pcieipc device list | awk "\$2 == \"0000:06:00.0\" {print \$1}") && [ -n "$index" ] &&
    { pcieipc device wait "$index" 0 --last-seen 1000000 2>/tmp/waiter & } && w=$! && sleep 0.5 &&
    host unplug ivs1 && ! wait $w && grep -q ENODEV /tmp/waiter &&
    pcieipc monitor --no-wait --json | grep -q "\"kind\":\"device_gone\",\"bdf\":\"0000:06:00.0\""'
check "monitor --json output is JSON lines with decoded kinds" sh -c '
    pcieipc monitor --no-wait --json > /tmp/all.json; pcieipc-fault-check json-lines /tmp/all.json'
check "monitor prints human lines" sh -c 'pcieipc monitor --no-wait | tail -3 | grep -q "#"'
check "unwatch, and unwatch again: ENOENT" sh -c '
    pcieipc link unwatch 0000:00:11.0 && ! pcieipc link unwatch 0000:00:11.0 2>/tmp/e && grep -q ENOENT /tmp/e'
check "function reset of edu: a RESET event, the device bound after" sh -c '
    index=$(pcieipc device list --json | tr "{" "\n" | grep "\"bdf\":\"0000:01:00.0\"" | sed "s/.*\"index\":\([0-9]*\).*/\1/") &&
    [ -n "$index" ] && pcieipc device reset "$index" &&
    pcieipc monitor --no-wait --json | grep "\"kind\":\"reset\",\"bdf\":\"0000:01:00.0\"" | grep -q "\"result\":\"ok\"" &&
    pcieipc device list | grep 0000:01:00.0 | grep -q Bound'
check "reset of a device index that does not exist: ENOENT" sh -c '
    ! pcieipc device reset 999 2>/tmp/e && grep -q ENOENT /tmp/e'
check "rmmod with a watch still active" rmmod pcieipc
check "insmod again: the event log starts empty" sh -c '
    insmod /lib/modules/pcieipc.ko && [ -z "$(pcieipc monitor --no-wait)" ] && rmmod pcieipc'
summary
