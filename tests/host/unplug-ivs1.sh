# Host side of tests/guest/hostctl.sh: unplugs ivs1 while the guest runs.
set -e
sleep 1
pcieipc-testbed hmp "device_del ivs1"
