# The AER action matrix's opt-in retrain for a device the module does not
# bind (a GPU with its vendor driver, in production), followed through the
# kernel's tracepoints (--link-of, PCIEIPC_LINK_TRACEFS) on the shm
# transport, where root allowed it (link_control). engine-aer.toml: ivs0
# 0000:01:00.0 below rp1, ivs1 0000:02:00.0 below rp2 (16 GT/s x16); the
# module is loaded but bound to neither. QEMU sets a root port's link to
# 2.5 GT/s x1 when an uncorrectable error is injected there, and a retrain
# does not bring it back: rank 1 retrains to 2.5 GT/s x1, and the chunk
# follows it (1 MiB, then 64 KiB). Every run is a checked sweep (-c 2: every call).
export PCIEIPC_LINK_TRACEFS=1
check "insmod pcieipc.ko; unbind ivs0 and ivs1 from it" sh -c '
    insmod /lib/modules/pcieipc.ko &&
    echo 0000:01:00.0 > /sys/bus/pci/drivers/pcieipc/unbind &&
    echo 0000:02:00.0 > /sys/bus/pci/drivers/pcieipc/unbind &&
    [ ! -e /sys/bus/pci/devices/0000:01:00.0/driver ] && [ ! -e /sys/bus/pci/devices/0000:02:00.0/driver ]'

# sweep OUT: a checked 1 MiB..16 MiB sweep on 2 shm ranks following ivs0
# and ivs1, retraining a degraded link after a recovery; a Completion
# Timeout injected on rp2 once the first row is out.
sweep() {
    inject_mid_sweep "$1" rp2 COMP_TIME --nranks 2 -b 1M -e 16M -f 2 -n 5 -w 1 -c 2 \
        --link-of 0000:01:00.0,0000:02:00.0 --retrain-degraded
}
# rows OUT FIRST LAST: 5 rows, no wrong element, the first row's chunk FIRST
# and the last row's LAST (or any).
rows() {
    awk -v first="$2" -v last="$3" '!/^#/ && NF == 14 { rows++; if ($9 != 0 || $13 != 0) bad++; chunk[rows] = $14 }
        END { exit !(rows == 5 && !bad && chunk[1] == first && (last == "any" || chunk[5] == last)) }' "$1"
}

allowed() {
    echo 0000:02:00.0 > /sys/module/pcieipc/parameters/link_control || return 1
    sweep /tmp/allowed.out; rc=$?
    grep "^# rank" /tmp/allowed.out
    [ "$rc" = 0 ] && rows /tmp/allowed.out 1048576 65536 &&
    grep -q "^# rank 1 fault [a-z]* call [0-9]*: 0000:0[02]:[01][01].0 .*Completion Timeout \[14\] non-fatal: await recovery, recovery answering again (config reads, link up), retrained: 2.5 GT/s x1, stall [0-9]* us$" /tmp/allowed.out &&
    pcieipc monitor --no-wait --json > /tmp/ev.json &&
    grep "\"kind\":\"link_retrain\"" /tmp/ev.json | grep "\"bdf\":\"0000:02:00.0\"" | grep -q "\"result\":\"ok\""
}
check "ivs1 allowed (link_control): after the recovery rank 1 retrains the degraded link through the module, the chunk follows it (1 MiB, then 64 KiB), exact, a link_retrain event names ivs1" \
    allowed

# retrains: how many link_retrain events the module's log holds (each reader
# reads the whole backlog).
retrains() { pcieipc monitor --no-wait --json | grep -c "\"kind\":\"link_retrain\""; }
# The first sweep left rp2 at 2.5 GT/s x1 (QEMU's doing): this one starts
# from that link's chunk and keeps it.
not_allowed() {
    echo > /sys/module/pcieipc/parameters/link_control || return 1
    before=$(retrains)
    sweep /tmp/refused.out; rc=$?
    grep "^# rank\|link_control" /tmp/refused.out
    after=$(retrains)
    echo "the job exited with $rc; link_retrain events in the module's log: $before before, $after after"
    [ "$rc" = 0 ] && [ "$before" = "$after" ] && rows /tmp/refused.out 65536 any &&
    grep -q "^# rank 1 fault [a-z]* call [0-9]*: 0000:0[02]:[01][01].0 .*Completion Timeout \[14\] non-fatal: await recovery, recovery answering again (config reads, link up), stall [0-9]* us$" /tmp/refused.out &&
    grep -q "retraining the degraded link above 0000:02:00.0: .*refused: pcieipc does not bind it and root has not allowed its link to be retrained (module parameter link_control); to allow it: pcieipc link allow 0000:02:00.0" /tmp/refused.out
}
check "ivs1 no longer allowed: the rank says the retrain was refused and how to allow it; the job goes on, exact, no retrain" \
    not_allowed
check "the ranks removed their tracing instances" [ -z "$(ls /sys/kernel/tracing/instances)" ]
check "rmmod pcieipc" rmmod pcieipc
summary
