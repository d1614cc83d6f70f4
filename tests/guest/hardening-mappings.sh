# Hardening of what userspace maps and what devices can reach (issue 14), on
# hardening.toml: edu 01:00.0 (device 0, bound by the ID table), pci-testdev
# 02:00.0 and e1000 03:00.0 handed over by driver_override (devices 1 and 2).
# Mappings go through an inode the module owns, so a device node on a tmpfs
# that is unmounted leaves nothing behind; a device that goes frees its DMA
# buffers at once, their mappings zapped, while their file is still open; a
# generic device masters the bus only while a DMA buffer allocated for it
# exists; a device that holds its INTx line asserted is masked, not left
# storming; a function reset zaps the device's mapped BARs; an unbind waits
# for the copies and allocations in flight, so no DMA memory outlives it.
check "insmod pcieipc.ko" insmod /lib/modules/pcieipc.ko
for f in 0000:02:00.0 0000:03:00.0; do
    echo pcieipc > "/sys/bus/pci/devices/$f/driver_override"
    echo "$f" > /sys/bus/pci/drivers_probe
done
check "pci-testdev and e1000 bound through driver_override (devices 1 and 2)" sh -c '
    [ -e /sys/bus/pci/drivers/pcieipc/0000:02:00.0 ] && [ -e /sys/bus/pci/drivers/pcieipc/0000:03:00.0 ]'

# Command register bit 2 (Bus Master Enable), through sysfs config.
bus_master() { echo $(( 0x$(od -An -tx1 -j4 -N1 "/sys/bus/pci/devices/$1/config" | tr -d " ") & 4 )); }
check "edu, which the module drives: Bus Master Enable set with no file open" [ "$(bus_master 0000:01:00.0)" = 4 ]
check "pci-testdev, driven from userspace: Bus Master Enable clear with no file open" [ "$(bus_master 0000:02:00.0)" = 0 ]
exec 3</dev/pcieipc
check "pci-testdev: Bus Master Enable still clear while a file of /dev/pcieipc is open with no DMA buffer" [ "$(bus_master 0000:02:00.0)" = 0 ]
exec 3<&-
# A DMA buffer allocated for pci-testdev (device 1) held by dma-touch until /tmp/bm.go.
buffer_masters() {
    rm -f /tmp/bm.ready /tmp/bm.go
    pcieipc-guest dma-touch --device 1 --size 4096 --ready /tmp/bm.ready --go /tmp/bm.go > /tmp/bm.out 2>&1 &
    p=$!
    while [ ! -e /tmp/bm.ready ] && kill -0 $p 2>/dev/null; do sleep 0.1; done
    during=$(bus_master 0000:02:00.0)
    during_edu=$(bus_master 0000:01:00.0)
    touch /tmp/bm.go; wait $p; rc=$?
    after=$(bus_master 0000:02:00.0)
    cat /tmp/bm.out; echo "pci-testdev Bus Master Enable: $during with its buffer, $after after; edu: $during_edu"
    [ "$rc" = 0 ] && [ "$during" = 4 ] && [ "$after" = 0 ] && [ "$during_edu" = 4 ]
}
check "pci-testdev: Bus Master Enable set while a DMA buffer allocated for it exists, clear once it is freed (edu's untouched)" buffer_masters

check "BAR window mapped through a device node on a tmpfs, the tmpfs unmounted: no busy inode left" sh -c '
    mkdir -p /mnt/nodes && mount -t tmpfs nodes /mnt/nodes &&
    mknod /mnt/nodes/pcieipc c $(tr ":" " " < /sys/class/misc/pcieipc/dev) &&
    pcieipc-guest mmap-node --node /mnt/nodes/pcieipc --device 1 --bar 0 &&
    umount /mnt/nodes && ! dmesg | grep "Busy inodes"'

check "e1000 holding INTx asserted: one interrupt counted and the line masked, not a storm; unmasked once the cause is cleared" \
    pcieipc-guest intx-level --device 2 --bdf 0000:03:00.0

check "edu's 64 KiB DMA buffers lie within its 28-bit reach (QEMU's default), not in the CMA area at the top of memory, and edu's copy between the highest two arrives" \
    pcieipc-guest dma-reach --device 0 --buffers 16 --size 65536

check "e1000's function reset zaps its mapped BAR0 page (faulted in again after), and a reader of its Device Status through 5 resets never reads it mid-reset" \
    pcieipc-guest reset-mapping --device 2 --offset 8

dma_race() {
    rm -f /tmp/race.ready
    pcieipc-guest dma-race --device 1 --size 16777216 --ready /tmp/race.ready > /tmp/race.out 2>&1 &
    p=$!
    while [ ! -e /tmp/race.ready ] && kill -0 $p 2>/dev/null; do sleep 0.05; done
    sleep 0.3
    echo 0000:02:00.0 > /sys/bus/pci/drivers/pcieipc/unbind
    wait $p; rc=$?
    cat /tmp/race.out
    dmesg | grep -E "DMA-API: (pci|pcieipc)" && return 1
    [ "$rc" = 0 ]
}
check "pci-testdev unbound while 16 MiB copies and allocations of its DMA buffers run: each call succeeds or gets ENODEV/ENOENT, and no DMA memory outlives the unbind (DMA-API debugging)" dma_race

check "unbind frees the device's 4 MiB DMA buffer at once, its mapping zapped (the stand-in page after, no SIGBUS), while its file is still open" sh -c '
    pcieipc-guest dma-touch --device 0 --size 4194304 --ready /tmp/dma.ready --go /tmp/dma.go > /tmp/dma.out 2>&1 &
    p=$!
    while [ ! -e /tmp/dma.ready ]; do sleep 0.1; done
    before=$(sed -n "s/^MemFree: *\([0-9]*\) kB/\1/p" /proc/meminfo)
    echo 0000:01:00.0 > /sys/bus/pci/drivers/pcieipc/unbind
    after=$(sed -n "s/^MemFree: *\([0-9]*\) kB/\1/p" /proc/meminfo)
    touch /tmp/dma.go
    wait $p
    rc=$?
    cat /tmp/dma.out
    echo "MemFree: $before kB before the unbind, $after kB after; dma-touch exit status $rc"
    [ $((after - before)) -ge 3072 ] && [ "$rc" = 0 ] && grep -q "after the go signal, then wrote it" /tmp/dma.out'

check "rmmod pcieipc" rmmod pcieipc
check "kernel log: no Oops, BUG, WARNING, busy inode or unhandled interrupt" sh -c '
    ! dmesg | grep -E "Oops|BUG|WARNING|general protection|Busy inodes|nobody cared"'
summary
