# pcieipc.ko loads, registers a root-only /dev/pcieipc, answers VERSION through
# the UAPI bindings (pcieipc device version), and unloads cleanly, twice.
userspace_version="$(pcieipc --version | awk 'NR == 1 {print $2}')"
check "without the module, --version says none is loaded" sh -c '
    pcieipc --version | tail -1 | grep -q "^ABI 0\.5; no module loaded (/dev/pcieipc absent)$"'

for round in 1 2; do
    check "round $round: insmod pcieipc.ko" insmod /lib/modules/pcieipc.ko
    check "round $round: /dev/pcieipc is a char device, mode 0600" sh -c '
        [ -c /dev/pcieipc ] && [ "$(stat -c %a /dev/pcieipc)" = 600 ]'
    check "round $round: VERSION ioctl reports ABI 0.5 and module $userspace_version" sh -c "
        pcieipc device version --json > /tmp/version.json && cat /tmp/version.json &&
        grep -q '\"abi_major\":0,\"abi_minor\":5,' /tmp/version.json &&
        grep -q '\"module_version\":\"$userspace_version\"' /tmp/version.json"
    check "round $round: --version names the loaded module's ABI" sh -c "
        pcieipc --version | tail -1 | grep -qx 'ABI 0\.5; loaded module $userspace_version speaks ABI 0\.5 (/dev/pcieipc)'"
    check "round $round: module is listed" grep -q '^pcieipc ' /proc/modules
    check "round $round: rmmod pcieipc" rmmod pcieipc
    check "round $round: /dev/pcieipc is gone" sh -c '[ ! -e /dev/pcieipc ]'
done
check "without the module, the CLI names the device and the fix" sh -c '
    ! pcieipc device version 2>/tmp/err; grep -q "/dev/pcieipc: cannot open" /tmp/err && grep -q insmod /tmp/err'
summary
