# Hardening of the module (issue 14) on the foundation fabric (edu 01:00.0
# behind root port 00:10.0): an old binary's smaller struct is accepted; BDFs outside the 16-bit domain of PCIEIPC_BDF are
# refused, never aliased to domain 0; a reader blocked waiting for events
# holds no lock that poll or another reader needs; unbind clears bus
# mastering.
check "insmod pcieipc.ko" insmod /lib/modules/pcieipc.ko

check "argsz: VERSION with ABI 0.3's smaller struct (48 bytes) is accepted, nothing written past it; 47 is EINVAL" \
    pcieipc-guest argsz-old

check "domain 0x10000 (VMD): link status and retrain of 10000:01:00.0 are refused naming the domain; 0000:01:00.0 is not retrained" sh -c '
    ! pcieipc link status 10000:01:00.0 2>/tmp/e && cat /tmp/e &&
    grep -q "10000:01:00.0: PCI domain 0x10000 does not fit" /tmp/e &&
    ! pcieipc link retrain 10000:01:00.0 2>/tmp/e && cat /tmp/e &&
    grep -q "10000:01:00.0: PCI domain 0x10000 does not fit" /tmp/e &&
    pcieipc monitor --no-wait --json > /tmp/ev.json && cat /tmp/ev.json &&
    ! grep -q "\"kind\":\"link_retrain\"" /tmp/ev.json'

check "two readers blocked in read(): poll answers in 100 ms, both sleep interruptibly, two events release them" \
    pcieipc-guest events-blocked-read

# Command register bit 2 (Bus Master Enable), through sysfs config.
bus_master() { echo $(( 0x$(od -An -tx1 -j4 -N1 /sys/bus/pci/devices/0000:01:00.0/config | tr -d " ") & 4 )); }
check "bound edu: Bus Master Enable set" [ "$(bus_master)" = 4 ]
check "unbind edu: Bus Master Enable cleared in its Command register" sh -c '
    echo 0000:01:00.0 > /sys/bus/pci/drivers/pcieipc/unbind &&
    cmd=$(od -An -tx1 -j4 -N1 /sys/bus/pci/devices/0000:01:00.0/config | tr -d " ") &&
    echo "Command register low byte after unbind: 0x$cmd" && [ $(( 0x$cmd & 4 )) = 0 ]'
check "rmmod pcieipc" rmmod pcieipc
summary
