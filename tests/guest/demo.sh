# The main job's demo: load the module, show what it binds, the fabric's
# links as the module reads them, a retrain and an injected AER error as
# events, an AllReduce over the module's ivshmem transport, then unload.
insmod /lib/modules/pcieipc.ko
pcieipc device version
echo "--- devices pcieipc binds"
pcieipc device list
echo "--- the PCI tree under the root ports (path vendor:device role link)"
pcieipc-guest tree
echo "--- links, as the module reads them"
for bdf in 0000:01:00.0 0000:02:00.0 0000:00:12.0 0000:05:00.0; do pcieipc link status $bdf; done
echo "--- retrain of edu's link, and a Completion Timeout injected on its root port"
pcieipc link retrain 0000:01:00.0
host hmp "pcie_aer_inject_error rp1 COMP_TIME" > /dev/null
sleep 1
echo "--- events (pcieipc monitor)"
pcieipc monitor --no-wait
echo "--- AllReduce over the module: 2 ranks, data in ivs0/ivs1's shared BAR window, doorbells, MSI-X waits"
# (stderr through cat: no progress bar on the serial console)
pcieipc bench --transport pcieipc --nranks 2 -b 8 -e 256K -f 8 -n 5 -w 1 --chunk-bytes 16K -c 1 2>&1 | cat
rmmod pcieipc
echo "pcieipc unloaded"
