# `pcieipc monitor --store --metrics` as the service runs it, in the guest: an
# AER error injected on root port rp2 (00:11.0, pcieport, above pci-testdev)
# raises pcieipc_aer_errors_total for that port's bit on the guest's own
# scrape (busybox wget on 127.0.0.1), and the event (through tracefs) is in
# the store.
PORT=00:11.0
BDF=0000:$PORT
STORE=/tmp/events.db
URL=http://127.0.0.1:9773/metrics

ip link set lo up
check "lo is up with 127.0.0.1" sh -c 'ip addr show lo | grep -q "inet 127.0.0.1/8"'
check "the boot id the store keys events by is readable" grep -qE "^[0-9a-f-]{36}$" /proc/sys/kernel/random/boot_id

pcieipc monitor --json --store $STORE --metrics 127.0.0.1:9773 > /tmp/mon.out 2> /tmp/mon.err &
MON=$!
i=0
until grep -q following /tmp/mon.err; do
    i=$((i + 1)); [ $i -lt 200 ] || break; sleep 0.1
done
cat /tmp/mon.err
check "the monitor follows tracefs, stores, serves metrics" sh -c \
    "grep -q 'following tracefs' /tmp/mon.err && grep -q 'storing events in $STORE' /tmp/mon.err && grep -q 'metrics at http://127.0.0.1:9773/metrics' /tmp/mon.err"

# cmplt_to: the port's Completion Timeout counter on a fresh scrape.
cmplt_to() {
    wget -q -O - $URL | grep '^pcieipc_aer_errors_total{' | grep "bdf=\"$BDF\"" |
        grep 'error="CmpltTO"' | grep 'severity="nonfatal"' | awk '{print $NF}'
}
BEFORE=$(cmplt_to)
echo "CmpltTO on $BDF before: $BEFORE"
check "the page has the port's Completion Timeout counter, at 0" [ "$BEFORE" = 0 ]
check "and its link: 8 GT/s x4, not degraded" sh -c \
    "wget -q -O - $URL > /tmp/page && grep -q '^pcieipc_link_speed_gts{bdf=\"0000:02:00.0\",.*} 8$' /tmp/page && grep -q '^pcieipc_link_width{bdf=\"0000:02:00.0\",.*} 4$' /tmp/page && grep -q '^pcieipc_link_degraded{bdf=\"0000:02:00.0\",.*} 0$' /tmp/page"

inject rp2 COMP_TIME
i=0
while [ "$(cmplt_to)" != 1 ] && [ $i -lt 100 ]; do i=$((i + 1)); sleep 0.1; done
AFTER=$(cmplt_to)
echo "CmpltTO on $BDF after: $AFTER"
check "the guest's own scrape: pcieipc_aer_errors_total{bdf=$BDF,severity=nonfatal,error=CmpltTO} rose to 1" [ "$AFTER" = 1 ]
# The counters and the tracing instance are read apart: the event may reach
# the page a poll later than the counter.
check "and pcieipc_events_total counts the tracefs AER event" sh -c \
    "for i in \$(seq 100); do wget -q -O - $URL | grep -q '^pcieipc_events_total{kind=\"aer\",source=\"tracefs\"} 1$' && exit 0; sleep 0.1; done; wget -q -O - $URL | grep pcieipc_events_total; exit 1"

i=0
while ! pcieipc events --store $STORE | grep -q "$BDF" && [ $i -lt 50 ]; do i=$((i + 1)); sleep 0.1; done
pcieipc events --store $STORE
check "the event is in the store: tracefs, $BDF, pcieport, CmpltTO non-fatal" sh -c \
    "pcieipc events --store $STORE --json | grep -q '\"bdf\":\"$BDF\",\"boot_id\":\"[0-9a-f-]*\",\"class\":\"PCI bridge\",\"driver\":\"pcieport\",\"errors\":\[{\"bit\":14,\"masked\":false,\"name\":\"Completion Timeout\",\"severity\":\"non_fatal\",\"short\":\"CmpltTO\"}\],\"kind\":\"aer\",\"seq\":0,\"source\":\"tracefs\"'"
pcieipc events --store $STORE --summary
check "events --summary names the port and the error" sh -c \
    "pcieipc events --store $STORE --summary | grep -qE '^  $BDF  PCI bridge +pcieport +nonfatal +CmpltTO +1$'"

check "without the module: pcieipc_module_loaded 0" sh -c "wget -q -O - $URL | grep -q '^pcieipc_module_loaded 0$'"
insmod /lib/modules/pcieipc.ko
check "with it: pcieipc_module_loaded 1, and its ABI and version" sh -c \
    "wget -q -O - $URL > /tmp/page && grep -q '^pcieipc_module_loaded 1$' /tmp/page && grep -qE '^pcieipc_module_info[{]abi=\"[0-9]+[.][0-9]+\",version=\"[^\"]+\"[}] 1$' /tmp/page"
grep '^pcieipc_module' /tmp/page
# The module gives every new reader its backlog: two monitors started one
# after the other print the retrain twice, the store keeps it once.
pcieipc link retrain 0000:01:00.0 > /dev/null
pcieipc monitor --no-wait --store $STORE > /tmp/backlog1 2> /dev/null
pcieipc monitor --no-wait --store $STORE > /tmp/backlog2 2> /dev/null
cat /tmp/backlog1
check "the module's backlog, read by two monitors: printed by both, stored once" sh -c \
    "[ \$(grep -c LINK_RETRAIN /tmp/backlog1) = 1 ] && [ \$(grep -c LINK_RETRAIN /tmp/backlog2) = 1 ] && [ \$(pcieipc events --store $STORE --json | grep -c '\"kind\":\"link_retrain\",.*\"source\":\"module\"') = 1 ]"
check "rmmod" rmmod pcieipc

kill -TERM $MON
if wait $MON; then RC=0; else RC=$?; fi
check "the monitor exits 0 on SIGTERM, its tracing instance gone" sh -c \
    "[ $RC = 0 ] && [ -z \"\$(ls /sys/kernel/tracing/instances)\" ]"
check "the store keeps the AER event once" [ "$(pcieipc events --store $STORE | grep -c 'AER reported')" = 1 ]
summary
