# pcieipc.ko binds both ivshmem-doorbell devices and the edu of
# datapath.toml, and LIST reports each one as the topology built it; RING on
# one ivshmem device raises the addressed vector of its peer, COUNTERS sees it.
check "insmod pcieipc.ko" insmod /lib/modules/pcieipc.ko
pcieipc device list --json > /tmp/list.json || true
pcieipc device list || true
check "LIST: 3 devices, all bound" sh -c '
    [ "$(grep -o "\"state\":\"bound\"" /tmp/list.json | wc -l)" = 3 ]'
check "LIST: ivshmem 1af4:1110 (6900:4368) twice, MSI-X with 2 vectors" sh -c '
    [ "$(grep -o "\"vendor\":6900,\"device\":4368,\"class_code\":[0-9]*,\"kind\":\"ivshmem\",\"irq_type\":\"msix\",\"num_vectors\":2" /tmp/list.json | wc -l)" = 2 ]'
check "LIST: edu 1234:11e8 (4660:4584) with MSI" \
    grep -q '"vendor":4660,"device":4584,"class_code":[0-9]*,"kind":"edu","irq_type":"msi","num_vectors":1' /tmp/list.json
check "LIST: link speed and width of the ports above (8 GT/s x4, 16 GT/s x8, 2.5 GT/s x1)" sh -c '
    grep -q "\"link_speed_gts\":8.0,\"link_width\":4" /tmp/list.json &&
    grep -q "\"link_speed_gts\":16.0,\"link_width\":8" /tmp/list.json &&
    grep -q "\"link_speed_gts\":2.5,\"link_width\":1" /tmp/list.json'
check "LIST: upstream ports are the root ports 00:10.0, 00:11.0, 00:12.0" sh -c '
    for p in 0000:00:10.0 0000:00:11.0 0000:00:12.0; do grep -q "\"upstream_bdf\":\"$p\"" /tmp/list.json || exit 1; done'
check "LIST: ivshmem BAR2 is 1 MiB, mappable, at mmap offset (index << 44) | (2 << 40)" sh -c '
    for i in $(grep -o "\"index\":[0-9]*,\"state\":\"bound\",\"bdf\":\"[^\"]*\",\"upstream_bdf\":\"[^\"]*\",\"vendor\":6900" /tmp/list.json | sed "s/\"index\":\([0-9]*\),.*/\1/"); do
        off=$(( (i << 44) | (2 << 40) ))
        grep -q "{\"index\":2,\"size\":1048576,\"mmap_offset\":$off,\"memory\":true,\"io\":false,\"bits64\":true,\"prefetchable\":true,\"mappable\":true}" /tmp/list.json || exit 1
    done'
check "LIST: ivshmem peers have distinct peer ids" sh -c '
    [ "$(grep -o "\"peer_id\":[0-9][0-9]*" /tmp/list.json | sort -u | wc -l)" = 2 ]'
check "LIST: only ivshmem BAR2 is mappable (not the MSI-X BAR1, not the module's register BARs)" sh -c '
    [ "$(grep -o "\"mappable\":true" /tmp/list.json | wc -l)" = 2 ]'
check "the memory BARs of the 3 devices are requested for pcieipc (/proc/iomem: 3 + 3 + 1)" sh -c '
    grep pcieipc /proc/iomem; [ "$(grep -c " : pcieipc\$" /proc/iomem)" = 7 ]'
check "VERSION reports 3 bound devices" sh -c 'pcieipc device version --json | grep -q "\"bound_devices\":3,"'
check "RING: device 0 rings vector 1 of device 1's peer id; device 1 counts it (COUNTERS 0 1)" sh -c '
    peer1=$(pcieipc device list | awk "\$1 == 1 {print \$NF}")
    [ "$(pcieipc device counters 1)" = "0 0" ] && pcieipc device ring 0 "$peer1" 1 &&
    [ "$(pcieipc device wait 1 1 --last-seen 0 --timeout-ms 2000)" = 1 ] &&
    [ "$(pcieipc device counters 1)" = "0 1" ] && [ "$(pcieipc device counters 0)" = "0 0" ]'
check "RING on edu (no doorbell) is refused with EOPNOTSUPP" sh -c '
    ! pcieipc device ring 2 0 0 2>/tmp/err; cat /tmp/err; grep -q "EOPNOTSUPP" /tmp/err'
check "WAIT on an unknown device index fails with ENOENT" sh -c '
    ! pcieipc device wait 99 0 --timeout-ms 10 2>/tmp/err; cat /tmp/err; grep -q ENOENT /tmp/err'
check "WAIT on a vector past the device's vectors fails with EINVAL" sh -c '
    ! pcieipc device wait 0 2 --timeout-ms 10 2>/tmp/err; cat /tmp/err; grep -q EINVAL /tmp/err'
check "driver_override hands pci-testdev (no ID-table entry of its own) to pcieipc: a generic device" sh -c '
    echo pcieipc > /sys/bus/pci/devices/0000:04:00.0/driver_override &&
    echo 0000:04:00.0 > /sys/bus/pci/drivers_probe &&
    pcieipc device list | grep -q "^3 0000:04:00.0 1b36:0005 Generic Bound"'
check "new_id: pci-testdev unbound and its override cleared, then its IDs written to new_id: bound again" sh -c '
    echo 0000:04:00.0 > /sys/bus/pci/drivers/pcieipc/unbind &&
    echo > /sys/bus/pci/devices/0000:04:00.0/driver_override &&
    [ ! -e /sys/bus/pci/devices/0000:04:00.0/driver ] &&
    echo "1b36 0005" > /sys/bus/pci/drivers/pcieipc/new_id &&
    pcieipc device list | grep -q "^[0-9]* 0000:04:00.0 1b36:0005 Generic Bound"'
check "unbind marks the device gone (ENODEV for waits, VERSION counts 3 bound)" sh -c '
    echo 0000:02:00.0 > /sys/bus/pci/drivers/pcieipc/unbind &&
    pcieipc device list | grep -q "^1 0000:02:00.0 1af4:1110 Ivshmem Gone" &&
    ! pcieipc device wait 1 0 --timeout-ms 10 2>/tmp/err && grep -q ENODEV /tmp/err &&
    pcieipc device version --json | grep -q "\"bound_devices\":3,"'
check "bind again: a new index (5) replaces the gone entry of that BDF" sh -c '
    echo 0000:02:00.0 > /sys/bus/pci/drivers/pcieipc/bind &&
    pcieipc device list | grep -q "^5 0000:02:00.0 1af4:1110 Ivshmem Bound" &&
    ! pcieipc device list | grep -q "^1 "'
check "root-only open (EACCES as uid 65534); without CAP_SYS_ADMIN: LIST/WAIT answer, RING/mmap of a BAR or a DMA buffer/DMA_ALLOC get EPERM" \
    pcieipc-guest caps-check
check "rmmod pcieipc with no file open" rmmod pcieipc
check "rmmod released every requested region" sh -c '! grep -q pcieipc /proc/iomem'
summary
