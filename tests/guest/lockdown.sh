# Kernel lockdown (issue 14) on the datapath topology: ivs0 01:00.0, ivs1
# 02:00.0 (its port serves a bound device: retraining it is allowed), edu
# 03:00.0, pci-testdev 04:00.0 (not bound). Like sysfs config/resourceN and
# setpci, the module's raw PCI access (BAR mmap, config-space writes:
# LINK_RETRAIN and RESET, CPU copies between a DMA buffer and a BAR) works
# before the kernel is locked down and gets EPERM after; DMA buffers, link
# status and events, which are not raw PCI access, keep working. Lockdown
# cannot be lifted, so every "before" check runs first.
check "insmod pcieipc.ko" insmod /lib/modules/pcieipc.ko
check "securityfs: lockdown is an active LSM, mode [none]" sh -c '
    mount -t securityfs none /sys/kernel/security &&
    echo "lsm: $(cat /sys/kernel/security/lsm)" && cat /sys/kernel/security/lockdown &&
    grep -q lockdown /sys/kernel/security/lsm &&
    grep -q "^\[none\]" /sys/kernel/security/lockdown'

edu=$(pcieipc device list | awk '$2 == "0000:03:00.0" {print $1}')
# config_write: writes the Command register's low byte of the unbound
# pci-testdev back unchanged through sysfs (pci_write_config: lockdown-checked).
config_write() {
    dd if=/sys/bus/pci/devices/0000:04:00.0/config of=/tmp/cmd bs=1 skip=4 count=1 2>/dev/null &&
    dd if=/tmp/cmd of=/sys/bus/pci/devices/0000:04:00.0/config bs=1 seek=4 count=1 conv=notrunc
}
# events KIND: how many events of KIND the module's log holds.
events() { pcieipc monitor --no-wait --json | grep -c "\"kind\":\"$1\"" || true; }

check "before lockdown: sysfs config write (04:00.0's Command register, same value) works" config_write
check "before lockdown: mmap of ivshmem BAR2, DMA_COPY buffer -> BAR2 and BAR2 -> buffer work (verified)" \
    pcieipc-guest raw-pci --expect allowed
check "before lockdown: LINK_RETRAIN of ivs1 (served port) completes" sh -c '
    pcieipc link retrain 0000:02:00.0 --json > /tmp/r.json && cat /tmp/r.json &&
    grep -q "\"completed\":true" /tmp/r.json'
check "before lockdown: RESET of edu (device $edu) works" sh -c "[ -n '$edu' ] && pcieipc device reset $edu"

check "echo integrity > /sys/kernel/security/lockdown: mode [integrity]" sh -c '
    echo integrity > /sys/kernel/security/lockdown && cat /sys/kernel/security/lockdown &&
    grep -q "\[integrity\]" /sys/kernel/security/lockdown'
refused_config_write() {
    ! config_write 2>/tmp/e; refused=$?; cat /tmp/e
    [ "$refused" = 0 ] && grep -q "Operation not permitted" /tmp/e
}
check "locked down: the same sysfs config write is refused (EPERM): lockdown is on" refused_config_write
check "locked down: mmap of BAR2 and both BAR copies get EPERM; DMA_ALLOC, DMA mmap, buffer copies still work" \
    pcieipc-guest raw-pci --expect refused
retrain_refused() {
    before=$(events link_retrain)
    ! pcieipc link retrain 0000:02:00.0 2>/tmp/e; refused=$?; cat /tmp/e
    after=$(events link_retrain); echo "LINK_RETRAIN events: $before before, $after after"
    [ "$refused" = 0 ] && grep -q "refused (EPERM): the kernel is locked down (integrity" /tmp/e &&
    [ "$before" = "$after" ]
}
check "locked down: LINK_RETRAIN of ivs1 gets EPERM, the CLI names the lockdown, no event" retrain_refused
reset_refused() {
    before=$(events reset)
    ! pcieipc device reset "$edu" 2>/tmp/e; refused=$?; cat /tmp/e
    after=$(events reset); echo "RESET events: $before before, $after after"
    [ "$refused" = 0 ] && grep -q "EPERM" /tmp/e && [ "$before" = "$after" ]
}
check "locked down: RESET of edu gets EPERM, no event" reset_refused
check "locked down: LINK_STATUS (a config read) still answers" pcieipc link status 0000:02:00.0
check "the kernel log has lockdown's notice for pcieipc's refusals, not only for dd's" sh -c '
    dmesg | grep "Lockdown: " &&
    dmesg | grep -q "Lockdown: pcieipc-guest: direct PCI access is restricted" &&
    dmesg | grep -q "Lockdown: pcieipc: direct PCI access is restricted"'
check "rmmod pcieipc" rmmod pcieipc
summary
