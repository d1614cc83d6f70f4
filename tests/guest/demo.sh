# The main job's demo: load the module, show the device and the fabric, unload.
insmod /lib/modules/pcieipc.ko
ls -l /dev/pcieipc
pcieipc device version
echo "PCI tree under the root ports (path vendor:device role link):"
pcieipc-guest tree
rmmod pcieipc
echo "pcieipc unloaded"
