# The guest sees exactly the fabric of the topology file: every port and
# endpoint at its place, with the link speed and width the file sets.
check "PCI tree matches the topology (sysfs)" pcieipc-guest tree
check "root port 00:10.0 runs at 2.5 GT/s x1" sh -c '
    [ "$(cat /sys/bus/pci/devices/0000:00:10.0/current_link_speed)" = "2.5 GT/s PCIe" ] &&
    [ "$(cat /sys/bus/pci/devices/0000:00:10.0/current_link_width)" = 1 ]'
check "two ivshmem-doorbell devices (1af4:1110)" sh -c '
    [ "$(grep -l 0x1110 /sys/bus/pci/devices/*/device | xargs -n1 dirname | xargs -I{} cat {}/vendor | grep -c 0x1af4)" = 2 ]'
summary
