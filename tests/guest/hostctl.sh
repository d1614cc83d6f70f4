# The harness acts on the guest's behalf over QMP: an uncorrectable AER error
# injected on a root port reaches the guest's AER driver; a hot-unplugged
# device leaves the guest's PCI tree. A host script (tests/host/unplug-ivs1.sh)
# unplugs ivs1 on its own while the guest watches.
check "QMP answers through the control channel" sh -c 'host hmp "info status" | grep -q running'
check "AER: COMP_TIME injected on rp1 reaches the guest's AER driver" sh -c '
    host hmp "pcie_aer_inject_error rp1 COMP_TIME" &&
    for i in $(seq 50); do
        dmesg | grep -q "AER: Uncorrectable (Non-Fatal) Error message received from 0000:00:10.0" &&
            dmesg | grep -q "\[14\] CmpltTO" && exit 0
        sleep 0.1
    done; dmesg | grep -i aer; exit 1'
check "an injection QEMU does not take (no port rp9) fails, saying what QEMU answered" sh -c '
    ! inject rp9 COMP_TIME 2>/tmp/e; refused=$?; cat /tmp/e
    [ "$refused" = 0 ] && grep -q "^QEMU did not take COMP_TIME on rp9: " /tmp/e'
check "hot-unplug of td0 (00:11.0/00.0) removes it from the guest" sh -c '
    host unplug td0 &&
    ! grep -q 0x0005 /sys/bus/pci/devices/*/device'
check "the host script's unplug of ivs1 arrives" sh -c '
    for i in $(seq 100); do
        [ "$(grep -l 0x1110 /sys/bus/pci/devices/*/device | wc -l)" = 1 ] && exit 0; sleep 0.1
    done; exit 1'
check "an unknown host request is refused" sh -c '! host frobnicate 2>/dev/null'
summary
