# Shared INTx lines (intx-shared.toml): edu 01:00.0 (device 0) and e1000
# 05:00.0 (device 1, handed over by driver_override) share one line. Each
# device's handler claims only its own interrupts, so neither counts the
# other's, and a storm on the line stays visible to the kernel's
# spurious-interrupt detection.
check "insmod pcieipc.ko" insmod /lib/modules/pcieipc.ko
echo pcieipc > /sys/bus/pci/devices/0000:05:00.0/driver_override
echo 0000:05:00.0 > /sys/bus/pci/drivers_probe
check "edu and e1000 bound, both on INTx, on the same line" sh -c '
    edu=$(cat /sys/bus/pci/devices/0000:01:00.0/irq); nic=$(cat /sys/bus/pci/devices/0000:05:00.0/irq)
    echo "edu IRQ $edu, e1000 IRQ $nic"; grep -E "^ *$edu:" /proc/interrupts
    [ -e /sys/bus/pci/drivers/pcieipc/0000:05:00.0 ] && [ "$edu" = "$nic" ] &&
    grep -qE "^ *$edu:.*IO-APIC.*pcieipc, pcieipc" /proc/interrupts'
check "an interrupt of one device on the shared line is never counted for the other" \
    pcieipc-guest intx-shared --edu 0 --nic 1 --nic-bdf 0000:05:00.0
check "rmmod pcieipc" rmmod pcieipc
check "kernel log: no Oops, BUG, WARNING or unhandled interrupt" sh -c '
    ! dmesg | grep -E "Oops|BUG|WARNING|general protection|nobody cared"'
summary
