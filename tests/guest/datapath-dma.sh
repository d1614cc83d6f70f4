# DMA (datapath.toml): copies between coherent DMA buffers, executed by edu's
# DMA engine (chunked through its 4 KiB window, one interrupt per step) and by
# the CPU on devices without one, verified byte for byte; the errno contract;
# unbinding edu during a copy ends its ticket with ENODEV.
check "insmod pcieipc.ko" insmod /lib/modules/pcieipc.ko
measure() {
    name="$1"; desc="$2"; shift 2
    check "$desc" sh -c '"$@" > "/tmp/$0.out" 2>&1' "$name" "$@"
    cat "/tmp/$name.out"
}
measure edu "edu DMA engine: 1 B, 4095 B, 4 KiB, 1 MiB copies verified byte for byte" \
    pcieipc-guest dma-copy --kind edu --sizes 1,4095,4096,1048576
measure cpu "CPU fallback on ivshmem-doorbell (no DMA engine): the same sizes verified" \
    pcieipc-guest dma-copy --kind ivshmem --sizes 1,4095,4096,1048576
echo pcieipc > /sys/bus/pci/devices/0000:04:00.0/driver_override
echo 0000:04:00.0 > /sys/bus/pci/drivers_probe
measure generic "CPU fallback on pci-testdev bound through driver_override" \
    pcieipc-guest dma-copy --kind generic --sizes 1,4096,65536
measure bar "buffer -> ivshmem BAR2 window -> buffer (CPU, unaligned), seen through the peer's window; bad BAR copies refused" \
    pcieipc-guest dma-bar
check "CLI: pcieipc device dma-copy on edu and on ivshmem names the engine and verifies" sh -c '
    pcieipc device dma-copy 2 --size 4096 | grep -q "device 2: 4096 bytes copied by the Edu engine in .* ms, verified" &&
    pcieipc device dma-copy 0 --size 65536 | grep -q "device 0: 65536 bytes copied by the Cpu engine in .* ms, verified"'
# The largest buffer the ABI allows needs 16 MiB of contiguous memory: a
# kernel with a CMA area (the testbed's) gives it; one without (Debian's,
# unless booted with cma=) refuses it with ENOMEM, and never with a warning
# in the kernel log (the harness fails the run on any WARNING).
big_buffer() {
    pcieipc device dma-copy 0 --size 16777216 > /tmp/big-dma.out 2>&1 && rc=0 || rc=$?
    if [ "$rc" = 0 ]; then grep -q "16777216 bytes copied by the Cpu engine in .* ms, verified" /tmp/big-dma.out
    else grep -q ENOMEM /tmp/big-dma.out; fi
}
check "a 16 MiB DMA buffer (PCIEIPC_DMA_MAX_SIZE): copied and verified, or refused with ENOMEM" big_buffer
cat /tmp/big-dma.out
measure errors "bad copies refused (EINVAL/ENOENT), EBUSY while edu copies, tickets collected once" \
    pcieipc-guest dma-errors
check "unbinding edu during a 1 MiB copy ends the copy's ticket with ENODEV" sh -c '
    pcieipc-guest dma-copy --kind edu --sizes 1048576 > /tmp/unbind.out 2>&1 &
    c=$!
    sleep 2
    echo 0000:03:00.0 > /sys/bus/pci/drivers/pcieipc/unbind
    ! wait $c; cat /tmp/unbind.out; grep -q ENODEV /tmp/unbind.out'
check "rmmod pcieipc" rmmod pcieipc
summary
