# AER hooks: every uncorrectable error QEMU can inject on the root port above
# edu (rp1, 00:10.0; edu is 01:00.0, bound by pcieipc) reaches pcieipc's
# error handlers; the events carry the decoded bit, the severity from the
# severity register and the recovery sequence the kernel ran. QEMU's default
# severities (the spec's): DLP, SDN, FCP, RX_OVER (Receiver Overflow), MALF_TLP fatal.
insmod /lib/modules/pcieipc.ko
check "edu is bound" sh -c 'pcieipc device list | grep -q 0000:01:00.0'
while read -r name bit severity; do
    check "AER $name on rp1: [$bit] $severity, recovered" \
        pcieipc-fault-check aer --bdf 0000:01:00.0 --inject "rp1 $name" --bit "$bit" --severity "$severity"
done <<'ERRORS'
DLP 4 fatal
SDN 5 fatal
POISON_TLP 12 non_fatal
FCP 13 fatal
COMP_TIME 14 non_fatal
COMP_ABORT 15 non_fatal
UNX_COMP 16 non_fatal
RX_OVER 17 fatal
MALF_TLP 18 fatal
ECRC 19 non_fatal
UNSUP 20 non_fatal
ACSV 21 non_fatal
ERRORS
check "monitor --json names the decoded errors" sh -c '
    pcieipc monitor --no-wait --json > /tmp/aer.json && pcieipc-fault-check json-lines /tmp/aer.json &&
    grep "\"aer_step\":\"error_detected\"" /tmp/aer.json | grep -q "\"short\":\"CmpltTO\",\"severity\":\"non_fatal\"" &&
    grep "\"aer_step\":\"error_detected\"" /tmp/aer.json | grep -q "\"short\":\"MalfTLP\",\"severity\":\"fatal\""'
check "rmmod after recoveries" rmmod pcieipc
summary
