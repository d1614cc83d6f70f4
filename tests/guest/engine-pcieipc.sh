# The AllReduce engine over the pcieipc transport (engine-pcieipc.toml): rank r
# of N = 2 and 4 uses the r-th of four ivshmem-doorbell devices of one region,
# data in the shared BAR2, doorbells and MSI-X waits between ranks. Every run
# is `pcieipc bench -c 2`, which checks every element of every rank's result
# exactly; the table's count column and both #wrong columns are asserted too.
check "insmod pcieipc.ko" insmod /lib/modules/pcieipc.ko
check "4 ivshmem-doorbell devices bound, 1 MSI-X vector each" sh -c '
    [ "$(pcieipc device list | grep -c "1af4:1110 Ivshmem Bound 1 Msix")" = 4 ]'

# allreduce COUNT BENCH-ARGS...: one size, out of place and in place, checked;
# the output is kept in /tmp/allreduce.out and printed on failure.
allreduce() {
    count="$1"; shift
    pcieipc bench --transport pcieipc -n 1 -w 0 -c 2 "$@" > /tmp/allreduce.out 2>&1 &&
    awk -v count="$count" '!/^#/ && NF >= 13 {
            rows++; if ($2 != count || $9 != 0 || $13 != 0) bad++ }
        END { exit !(rows == 1 && !bad) }' /tmp/allreduce.out ||
    { cat /tmp/allreduce.out; return 1; }
}
bytes_of() { case "$1" in uint8) echo 1;; half|bfloat16) echo 2;; float|int32) echo 4;; *) echo 8;; esac; }

for n in 2 4; do
    # float sum at every size; 64 KiB chunks: the ring crosses chunks at 1 MiB + 3.
    for count in 0 1 $((n + 1)) 1009 1048579; do
        size=$((count * 4))
        check "N=$n float sum, $count elements: every rank's result exact" \
            allreduce $count --nranks $n --chunk-bytes 64K -b $size -e $size -d float -o sum
    done
    cat /tmp/allreduce.out
    # Every dtype × op, on the ring with 1 KiB chunks (a message crosses many
    # chunks and slots) and on the one-shot path.
    for dtype in float double half bfloat16 int32 int64 uint8; do
        for op in sum prod min max avg; do
            for count in $((n + 1)) 1009; do
                size=$((count * $(bytes_of $dtype)))
                check "N=$n $dtype $op, $count elements, ring with 1 KiB chunks: exact" \
                    allreduce $count --nranks $n --chunk-bytes 1K --algorithm ring -b $size -e $size -d $dtype -o $op
                check "N=$n $dtype $op, $count elements, one-shot: exact" \
                    allreduce $count --nranks $n --chunk-bytes 64K --algorithm one-shot -b $size -e $size -d $dtype -o $op
            done
        done
    done
    check "N=$n 8-byte latency over 200 checked iterations" sh -c "
        pcieipc bench --transport pcieipc --nranks $n --chunk-bytes 64K -b 8 -e 8 -n 200 -w 20 -c 2 > /tmp/latency$n.out 2>&1"
    cat /tmp/latency$n.out
done

# Ranks started by hand; rank 1 is killed mid-sweep. Rank 0 must fail on its
# own (not by the 20 s `timeout`, exit 124) and name rank 1 and its pid.
check "N=2: rank 1 killed mid-run: rank 0 fails naming it, no hang" sh -c '
    job="--transport pcieipc --nranks 2 --chunk-bytes 64K -b 4M -e 4M -n 100000 -w 0 -c 0 --rendezvous killed"
    pcieipc bench $job --rank 1 > /dev/null 2>&1 &
    victim=$!
    timeout 20 pcieipc bench $job --rank 0 > /tmp/killed.out 2>&1 &
    survivor=$!
    sleep 3
    kill -9 $victim
    wait $survivor; rc=$?
    [ $rc != 0 ] && [ $rc != 124 ] && grep -q "rank 1 (pid $victim) exited" /tmp/killed.out'
cat /tmp/killed.out

check "windows larger than the region: rank 0 names its device and the bytes needed" sh -c '
    ! pcieipc bench --transport pcieipc --nranks 1 --chunk-bytes 2M -b 8 -e 8 > /tmp/toobig.out 2>&1 &&
    grep -q "rank 0: pcieipc transport: device 0: BAR2 holds 16777216 bytes, the windows of 1 ranks need [0-9]*" /tmp/toobig.out'
cat /tmp/toobig.out
check "the same on 2 ranks: rank 1 learns at once that rank 0 failed, rather than at its join timeout" sh -c '
    timeout 10 pcieipc bench --transport pcieipc --nranks 2 --chunk-bytes 2M -b 8 -e 8 > /tmp/toobig2.out 2>&1
    rc=$?
    [ $rc != 0 ] && [ $rc != 124 ] &&
    grep -q "rank 0: pcieipc transport: device 0: BAR2 holds 16777216 bytes" /tmp/toobig2.out &&
    grep -q "rank 0 failed to set up the transport before admitting the ranks" /tmp/toobig2.out'
cat /tmp/toobig2.out
check "rmmod pcieipc" rmmod pcieipc
summary
