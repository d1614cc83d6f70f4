# Root's per-device opt-in to link control of devices pcieipc does not bind
# (the module parameter link_control; kmod/link_control.rs), on
# link-control.toml: td0 01:00.0 below root port 00:10.0 (the GPU of a
# server), nic0 02:00.0 (an e1000) below 00:11.0, an ahci 05:00.0 and td1
# 06:00.0 below the switch 03:00.0 on 00:12.0. No device is bound.
PARAM=/sys/module/pcieipc/parameters/link_control
check "insmod pcieipc.ko (no link_control): the list is empty" sh -c '
    insmod /lib/modules/pcieipc.ko && [ "$(cat '$PARAM')" = "" ] &&
    pcieipc link allowed | grep -q "no device" && [ "$(pcieipc link allowed --json)" = "[]" ]'
check "the parameter is root's: mode 0644" [ "$(stat -c %a $PARAM)" = 644 ]

# retrain_event BDF: the module logged a successful retrain of BDF.
retrain_event() {
    pcieipc monitor --no-wait --json > /tmp/ev.json
    grep "\"kind\":\"link_retrain\"" /tmp/ev.json | grep "\"bdf\":\"$1\"" | grep -q "\"result\":\"ok\""
}
# tls BDF: the Target Link Speed of BDF's port (LnkCtl2 bits 3:0).
tls() { echo $(( $(link_ctl "$(port_of "$1")" | cut -d" " -f2) & 15 )); }

refused_unlisted() {
    before=$(link_ctl 0000:00:10.0) && echo "LnkCtl LnkCtl2 before: $before"
    pcieipc monitor --no-wait > /dev/null
    ! pcieipc link retrain 0000:01:00.0 2>/tmp/e; refused=$?; cat /tmp/e
    after=$(link_ctl 0000:00:10.0) && echo "LnkCtl LnkCtl2 after: $after"
    [ "$refused" = 0 ] && [ "$before" = "$after" ] &&
    grep -q "retrain of the link above 0000:01:00.0 refused: pcieipc does not bind it and root has not allowed its link to be retrained (module parameter link_control); to allow it: pcieipc link allow 0000:01:00.0" /tmp/e &&
    dmesg | grep -q "retrain of the link above 0000:01:00.0 refused: .*link_control; to allow it: add 0000:01:00.0 to /sys/module/pcieipc/parameters/link_control" &&
    ! pcieipc monitor --no-wait --json | grep -q "\"kind\":\"link_retrain\""
}
check "td0 not listed: LINK_RETRAIN refused naming link_control and the line that allows it (CLI and kernel log); LnkCtl/LnkCtl2 untouched, no event" \
    refused_unlisted

allowed_by_sysfs() {
    echo 0000:01:00.0 > $PARAM && [ "$(cat $PARAM)" = "0000:01:00.0" ] &&
    before=$(tls 0000:01:00.0) && echo "TLS before: $before" &&
    pcieipc link retrain 0000:01:00.0 --json > /tmp/r.json && cat /tmp/r.json &&
    grep -q "\"completed\":true" /tmp/r.json && retrain_event 0000:01:00.0 &&
    pcieipc link retrain 0000:01:00.0 --speed 1 > /dev/null && pcieipc link retrain 0000:01:00.0 --speed max > /dev/null &&
    after=$(tls 0000:01:00.0) && echo "TLS after: $after" && [ "$before" = "$after" ]
}
check "echo 0000:01:00.0 > link_control: retrains (plain, --speed 1, --speed max) complete, a link_retrain event names td0, Target Link Speed as it was" \
    allowed_by_sysfs
check "td1 (06:00.0) not listed stays refused" sh -c '
    ! pcieipc link retrain 0000:06:00.0 2>/tmp/e; grep -q "pcieipc link allow 0000:06:00.0" /tmp/e'

concurrent() {
    before=$(tls 0000:01:00.0)
    pids=""
    for i in 1 2 3 4; do
        pcieipc link retrain 0000:01:00.0 --speed $((i % 2 + 1)) > /tmp/c$i.out 2>&1 & pids="$pids $!"
    done
    rc=0; for p in $pids; do wait $p || rc=1; done
    cat /tmp/c*.out
    after=$(tls 0000:01:00.0); echo "TLS before $before after $after"
    [ "$rc" = 0 ] && [ "$before" = "$after" ] && [ "$(grep -c "training ended" /tmp/c*.out | awk -F: '{ s += $2 } END { print s }')" = 4 ]
}
check "four retrains of one port at once (target speeds 1 and 2): all end without error, Target Link Speed restored" concurrent

check "pcieipc link allow adds nic0 (an e1000: a listed NIC is retrained), keeping td0" sh -c '
    pcieipc link allow 0000:02:00.0 && [ "$(cat '$PARAM')" = "0000:01:00.0,0000:02:00.0" ] &&
    pcieipc link retrain 0000:02:00.0 | grep -q "training ended"'
storage() {
    pcieipc link allow 05:00.0 0000:03:00.0 && [ "$(cat $PARAM)" = "0000:01:00.0,0000:02:00.0,0000:05:00.0,0000:03:00.0" ] || return 1
    ! pcieipc link retrain 0000:05:00.0 2>/tmp/e1; a=$?; cat /tmp/e1
    ! pcieipc link retrain 0000:03:00.0 2>/tmp/e2; b=$?; cat /tmp/e2
    [ "$a$b" = 00 ] &&
    grep -q "retrain of the link above 0000:05:00.0 refused: mass-storage function 0000:05:00.0 hangs from the same port" /tmp/e1 &&
    grep -q "retrain of the link above 0000:03:00.0 refused: mass-storage function 0000:05:00.0 hangs from the same port" /tmp/e2 &&
    dmesg | grep -q "mass-storage function 0000:05:00.0 is below port 0000:00:12.0"
}
check "listed ahci (05:00.0) and listed switch port 03:00.0 (the ahci below its root port): refused naming the drive" storage
check "pcieipc link disallow drops the drive and the switch port; allowed lists the rest" sh -c '
    pcieipc link disallow 0000:05:00.0 0000:03:00.0 > /dev/null && [ "$(pcieipc link allowed --json)" = "[\"0000:01:00.0\",\"0000:02:00.0\"]" ]'
# refused_whole TEXT REASON: writing TEXT fails, the list in force is
# unchanged, and the kernel log names REASON.
refused_whole() {
    before=$(cat $PARAM)
    ! echo "$1" 2>/tmp/w > $PARAM; failed=$?; cat /tmp/w
    after=$(cat $PARAM); echo "list before: '$before', after: '$after'"
    dmesg | tail -2
    [ "$failed" = 0 ] && [ "$before" = "$after" ] && grep -q "Invalid argument" /tmp/w &&
    dmesg | tail -5 | grep -qF "link_control: refused, the list in force is unchanged: $2"
}
check "a malformed entry refuses the whole list (nothing half-applied)" \
    refused_whole "0000:06:00.0,garbage" "'garbage' is not a PCI address"
check "device 0x20 (out of range)" refused_whole "0000:01:20.0" "'0000:01:20.0' is not a PCI address"
check "function 8 (out of range)" refused_whole "0000:01:00.8" "'0000:01:00.8' is not a PCI address"
check "bus 0x100 (out of range)" refused_whole "0000:100:00.0" "'0000:100:00.0' is not a PCI address"
check "a domain above 0xffff" refused_whole "10000:01:00.0" "'10000:01:00.0': PCI domains above 0xffff are not supported"
check "a duplicate (0000:06:00.0 and 06:00.0)" refused_whole "0000:06:00.0,06:00.0" "'06:00.0' is listed twice"
many=$(i=0; while [ $i -lt 65 ]; do printf '0000:%02x:00.0,' $i; i=$((i + 1)); done)
check "65 devices (more than the module keeps)" refused_whole "${many%,}" "more than 64 devices"
long=$(i=0; while [ $i -lt 315 ]; do printf '0000:01:00.0,'; i=$((i + 1)); done)
check "a 4 KiB list (${#long} bytes)" refused_whole "${long%,}" "'0000:01:00.0' is listed twice"
check "the CLI names a bad address before writing: pcieipc link allow 10000:01:00.0 / 0000:01:20.0" sh -c '
    ! pcieipc link allow 10000:01:00.0 2>/tmp/e && grep -q "PCI domains above 0xffff" /tmp/e &&
    ! pcieipc link allow 0000:01:20.0 2>/tmp/e && grep -q "0000:01:20.0" /tmp/e &&
    [ "$(cat '$PARAM')" = "0000:01:00.0,0000:02:00.0" ]'
check "an empty write clears the list; td0 is refused again" sh -c '
    echo > '$PARAM' && [ "$(cat '$PARAM')" = "" ] && ! pcieipc link retrain 0000:01:00.0 2>/dev/null'

check "rmmod; insmod with link_control=0000:01:00.0 at load: retrain of td0 works, td1 refused" sh -c '
    rmmod pcieipc && insmod /lib/modules/pcieipc.ko link_control=0000:01:00.0 &&
    [ "$(cat '$PARAM')" = "0000:01:00.0" ] &&
    pcieipc link retrain 0000:01:00.0 | grep -q "training ended" && ! pcieipc link retrain 0000:06:00.0 2>/dev/null'
check "insmod with a malformed link_control fails to load, naming the entry" sh -c '
    rmmod pcieipc && ! insmod /lib/modules/pcieipc.ko link_control=0000:01:00.0,nonsense 2>/tmp/e &&
    ! grep -q "^pcieipc " /proc/modules && dmesg | tail -5 | grep -q "'"'"'nonsense'"'"' is not a PCI address"'
check "insmod pcieipc.ko again, rmmod" sh -c 'insmod /lib/modules/pcieipc.ko && rmmod pcieipc'
summary
