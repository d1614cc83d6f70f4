# Errors of devices pcieipc does not bind reach `pcieipc monitor` through the
# kernel's tracepoints (ras:aer_event, pci:pcie_link_event) in a tracefs
# instance of the monitor's own, or through the aer_dev_* counters where
# tracing is unavailable; with the module loaded, its events and the
# tracepoints' come as one stream in time order. rp2 (00:11.0) is a root port
# driven by pcieport above pci-testdev (02:00.0), which no driver binds; rp1
# (00:10.0) is above edu (01:00.0), which pcieipc binds.
T=/sys/kernel/tracing
check "tracefs is mounted and has ras:aer_event and pci:pcie_link_event" \
    test -e $T/events/ras/aer_event/enable -a -e $T/events/pci/pcie_link_event/enable
check "no pcieipc module, no device bound to pci-testdev" \
    sh -c '[ ! -e /dev/pcieipc ] && [ ! -e /sys/bus/pci/devices/0000:02:00.0/driver ]'

# follow ARGS...: pcieipc monitor ARGS in the background, output in
# /tmp/mon.out, stderr in /tmp/mon.err; returns once it says it follows.
follow() {
    # Both emptied here, not only by the redirections below: the background
    # shell may open them after the wait has read the last monitor's
    # "following", and an error injected before this monitor reads its
    # baseline or opens its tracefs instance goes unseen.
    : > /tmp/mon.out
    : > /tmp/mon.err
    pcieipc monitor "$@" > /tmp/mon.out 2> /tmp/mon.err &
    MON=$!
    i=0
    until grep -q following /tmp/mon.err; do
        i=$((i + 1)); [ $i -lt 200 ] || { cat /tmp/mon.err; return 1; }; sleep 0.1
    done
}
# stop N: waits (10 s at most) for N lines of output, then SIGTERM; the
# monitor's exit status goes to /tmp/mon.rc.
stop() {
    i=0
    while [ "$(wc -l < /tmp/mon.out)" -lt "$1" ] && [ $i -lt 100 ]; do i=$((i + 1)); sleep 0.1; done
    kill -TERM $MON
    if wait $MON; then echo 0 > /tmp/mon.rc; else echo $? > /tmp/mon.rc; fi
}
# shorts FILE: the decoded errors' short names and severities, in order.
shorts() { grep -o '"short":"[A-Za-z]*","severity":"[a-z_]*"' "$1" | sed 's/"short":"//; s/","severity":"/:/; s/"$//' | tr '\n' ' '; }

# First, while rp2's link is as configured (QEMU resets a root port's link
# registers to 2.5 GT/s x1 on every injected uncorrectable error).
echo "--- link events: rp2 removed and rescanned"
follow --json --source tracefs
echo 1 > /sys/bus/pci/devices/0000:00:11.0/remove
echo 1 > /sys/bus/pci/rescan
stop 2
cat /tmp/mon.out
check "the rescan's link events: 00:11.0, reasons add_bus then bwctrl_enable" \
    [ "$(sed 's/.*"kind":"link_change","bdf":"\([0-9a-f:.]*\)".*"reason":"\([a-z_]*\)","source":"tracefs"}/\1:\2/' /tmp/mon.out | tr '\n' ' ')" = \
      "0000:00:11.0:add_bus 0000:00:11.0:bwctrl_enable " ]
check "both give rp2's link: 8 GT/s (generation 3) x4 of 8 GT/s, link active" \
    [ "$(grep -c '"link_after":{"bdf":"0000:00:11.0","upstream_port":"-","speed":3,"width":4,"max_speed":3,.*"dll_link_active":true' /tmp/mon.out)" = 2 ]
check "the instance is gone" [ -z "$(ls $T/instances)" ]

echo "--- tracefs, no module: COMP_TIME, BAD_TLP, MALF_TLP injected on rp2"
follow --json
inject rp2 COMP_TIME
inject rp2 BAD_TLP
inject rp2 MALF_TLP
stop 3
cat /tmp/mon.out
check "monitor followed tracefs only (no module)" sh -c 'grep -q "following tracefs (instance /sys/kernel/tracing/instances/pcieipc-monitor-" /tmp/mon.err && ! grep -q "following module" /tmp/mon.err'
check "monitor exited 0 on SIGTERM" [ "$(cat /tmp/mon.rc)" = 0 ]
check "its tracing instance is gone" [ -z "$(ls $T/instances)" ]
check "three tracefs AER events, all for 00:11.0" \
    sh -c '[ "$(grep -c "\"kind\":\"aer\",\"bdf\":\"0000:00:11.0\",.*\"source\":\"tracefs\"}" /tmp/mon.out)" = 3 ] && [ "$(wc -l < /tmp/mon.out)" = 3 ]'
# QEMU leaves Completion Timeout set in the port's status register: the
# fatal report carries it next to Malformed TLP, as the kernel's log does.
check "bits by the spec's positions, severity as reported: CmpltTO non-fatal, BadTLP correctable, CmpltTO+MalfTLP fatal" \
    [ "$(shorts /tmp/mon.out)" = "CmpltTO:non_fatal BadTLP:correctable CmpltTO:fatal MalfTLP:fatal " ]
check "the Completion Timeout as a whole record" grep -q \
    '"kind":"aer","bdf":"0000:00:11.0","errors":\[{"bit":14,"name":"Completion Timeout","short":"CmpltTO","severity":"non_fatal","masked":false}\],"source":"tracefs"}' /tmp/mon.out
check "Bad TLP is bit 6" grep -q '{"bit":6,"name":"Bad TLP","short":"BadTLP","severity":"correctable"' /tmp/mon.out
check "Malformed TLP is bit 18" grep -q '{"bit":18,"name":"Malformed TLP","short":"MalfTLP","severity":"fatal"' /tmp/mon.out

echo "--- no tracefs (wrong root): the aer_dev_* counters, UNSUP injected on rp2"
follow --json --tracefs-root /nonexistent --poll-ms 100
inject rp2 UNSUP
stop 1
cat /tmp/mon.err /tmp/mon.out
check "monitor says it falls back to the counters" \
    grep -q "tracefs: /nonexistent: tracefs is not mounted there .*using the aer_dev_\* counters instead" /tmp/mon.err
# The kernel counts every bit set in the port's status when it reports, and
# QEMU leaves Completion Timeout and Malformed TLP set from the injections
# above: one report, three counters up by one.
check "the counters source: one report on 00:11.0 (bit 20 UnsupReq, with 14 and 18 still set), non-fatal" \
    [ "$(shorts /tmp/mon.out)" = "CmpltTO:non_fatal MalfTLP:non_fatal UnsupReq:non_fatal " ]
check "the counters record: 00:11.0, bit 20 named, one occurrence, source counters" grep -q \
    '"kind":"aer","bdf":"0000:00:11.0","errors":\[{"bit":14,.*{"bit":20,"name":"Unsupported Request","short":"UnsupReq","severity":"non_fatal","masked":false}\],"occurrences":1,"source":"counters"}' /tmp/mon.out
check "exactly one event" [ "$(wc -l < /tmp/mon.out)" = 1 ]

echo "--- module loaded: its events and the tracepoints' in one stream (retrain, COMP_TIME on rp1)"
insmod /lib/modules/pcieipc.ko
follow --json
pcieipc link retrain 0000:01:00.0 > /dev/null
inject rp1 COMP_TIME
stop 5
cat /tmp/mon.out
check "monitor followed the module and tracefs" grep -q "following module (/dev/pcieipc), tracefs" /tmp/mon.err
# The kernel traces the error (aer_print_error) before it calls the drivers'
# error handlers: the merged stream has it between the retrain and them.
check "in time order: module retrain, tracefs AER on rp1, module error_detected, mmio_enabled, resume" \
    [ "$(sed 's/.*"kind":"\([a-z_]*\)","bdf":"\([0-9a-f:.]*\)".*"source":"\([a-z]*\)"}/\3:\1:\2/' /tmp/mon.out | tr '\n' ' ')" = \
      "module:link_retrain:0000:01:00.0 tracefs:aer:0000:00:10.0 module:aer:0000:01:00.0 module:aer:0000:01:00.0 module:aer:0000:01:00.0 " ]
check "module steps in order" [ "$(grep -o '"aer_step":"[a-z_]*"' /tmp/mon.out | tr '\n' ' ')" = \
    '"aer_step":"error_detected" "aer_step":"mmio_enabled" "aer_step":"resume" ' ]
check "both sources decode Completion Timeout as bit 14, non-fatal" \
    [ "$(shorts /tmp/mon.out)" = "CmpltTO:non_fatal CmpltTO:non_fatal CmpltTO:non_fatal CmpltTO:non_fatal " ]
check "timestamps never go back" awk -F'"timestamp_ns":' '{ split($2, a, ","); if (a[1] + 0 < last) exit 1; last = a[1] + 0 }' /tmp/mon.out
check "rmmod" rmmod pcieipc

echo "--- errors the monitor reports rather than hides"
check "--no-wait with no module and no backlog source: an error naming the module" sh -c \
    '! pcieipc monitor --no-wait 2> /tmp/e && grep -q "no event source could be opened: module: /dev/pcieipc: cannot open" /tmp/e'
check "--source tracefs on a path without tracefs: an error naming the path" sh -c \
    '! pcieipc monitor --source tracefs --tracefs-root /nonexistent --seconds 1 2> /tmp/e && grep -q "/nonexistent: tracefs is not mounted there" /tmp/e'
check "--seconds bounds a follow with no events" sh -c \
    '[ -z "$(pcieipc monitor --seconds 0.5 2> /dev/null)" ] && [ -z "$(ls '$T'/instances)" ]'
summary
