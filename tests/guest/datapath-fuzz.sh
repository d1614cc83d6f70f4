# Robustness: 10,000 random ioctls (random numbers, sizes, NULL, unmapped and
# kernel pointers, out-of-range indices), 1,000 random mmaps and 500
# plausible DMA copies (real buffers, random ranges, BAR flags; the file is
# closed with edu copies possibly running) on /dev/pcieipc give only errnos;
# the harness fails the run on any kernel WARNING/BUG/Oops in the guest log.
# The devices still work afterwards.
check "insmod pcieipc.ko" insmod /lib/modules/pcieipc.ko
for seed in 1 2; do
    check "fuzz seed $seed: 10,000 random ioctls + 1,000 random mmaps + 500 DMA copies, only errnos" sh -c "
        pcieipc-guest fuzz --iterations 10000 --seed $seed > /tmp/fuzz$seed.out 2>&1"
    cat /tmp/fuzz$seed.out
done
check "after the fuzzing, RING and WAIT still work" sh -c '
    peer1=$(pcieipc device list | awk "\$1 == 1 {print \$NF}")
    base=$(pcieipc device counters 1 | awk "{print \$1}")
    pcieipc device ring 0 "$peer1" 0 &&
    [ "$(pcieipc device wait 1 0 --last-seen "$base" --timeout-ms 2000)" -gt "$base" ]'
check "rmmod pcieipc" rmmod pcieipc
summary
