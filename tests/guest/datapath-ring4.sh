# Four ivshmem-doorbell devices of one region (ivshmem-quad.toml): 4
# processes pass a checked pattern around the circle, 10,000 times.
check "insmod pcieipc.ko" insmod /lib/modules/pcieipc.ko
check "4 ivshmem-doorbell devices bound, 1 MSI-X vector each, distinct peer ids" sh -c '
    [ "$(pcieipc device list | grep -c "1af4:1110 Ivshmem Bound 1 Msix")" = 4 ] &&
    [ "$(pcieipc device list | awk "/Ivshmem/ {print \$NF}" | sort -u | wc -l)" = 4 ]'
for members in 4; do
    check "ping-pong: 10,000 rounds around $members processes, every pattern verified" sh -c "
        pcieipc-guest ping-pong --members $members --rounds 10000 > /tmp/ring$members.out 2>&1"
    cat /tmp/ring$members.out
done
check "rmmod pcieipc" rmmod pcieipc
summary
