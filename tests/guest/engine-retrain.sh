# The opt-in retrain of the AER action matrix (docs/fault-path.md): after the
# kernel recovered a rank's device from a non-fatal error, the rank retrains
# its link where it reads degraded, and the next calls' chunk follows the
# speed the link trained to. engine-aer.toml: rank r uses ivs r below its own
# 16 GT/s x16 root port (1 MiB chunks). QEMU sets a root port's link to
# 2.5 GT/s x1 when an uncorrectable error is injected there, and a retrain
# does not bring it back: the rank retrains to 2.5 GT/s x1, and the chunk
# follows it (64 KiB).
check "insmod pcieipc.ko" insmod /lib/modules/pcieipc.ko

# A checked 1 MiB..16 MiB sweep, a Completion Timeout injected on rp2 (ivs1's
# port) after its first row.
retrain_mid_sweep() {
    inject_mid_sweep /tmp/retrain.out rp2 COMP_TIME --transport pcieipc --nranks 2 \
        -b 1M -e 16M -f 2 -n 5 -w 1 -c 2 --retrain-degraded &&
        grep -q "^# rank 1 fault [a-z]* call [0-9]*: 0000:02:00.0 Completion Timeout \[14\] non-fatal: await recovery, recovery recovered (resume), retrained: 2.5 GT/s x1, stall [0-9]* us$" /tmp/retrain.out &&
        awk '!/^#/ && NF == 14 { rows++; if ($9 != 0 || $13 != 0) bad++; chunk[rows] = $14 }
            END { exit !(rows == 5 && !bad && chunk[1] == 1048576 && chunk[5] == 65536) }' /tmp/retrain.out
}
check "Completion Timeout on rank 1's link mid-sweep, --retrain-degraded: rank 1 retrains the degraded link after the recovery, chunks 1 MiB then 64 KiB, exact" \
    retrain_mid_sweep
grep "^# rank" /tmp/retrain.out
check "the module's events: the recovery (error_detected, resume), then the retrain of ivs1's link" sh -c '
    pcieipc monitor --no-wait --json > /tmp/events.json &&
    [ "$(grep "\"bdf\":\"0000:02:00.0\"" /tmp/events.json | grep -o "\"kind\":\"[a-z_]*\"\(,\"bdf\":\"[0-9a-f:.]*\",\"aer_step\":\"[a-z_]*\"\)\?" |
        sed "s/\"kind\":\"\([a-z_]*\)\".*\"aer_step\":\"\([a-z_]*\)\"/\1:\2/; s/\"kind\":\"\([a-z_]*\)\"/\1/" | grep -v link_change | tr "\n" " ")" = \
      "aer:error_detected aer:mmio_enabled aer:resume link_retrain " ]'
check "rmmod pcieipc" rmmod pcieipc
summary
