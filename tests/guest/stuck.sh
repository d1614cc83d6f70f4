# Never finishes, on purpose: scripts/test.sh checks that the harness kills a
# run at its time limit and says who was stuck (no request of the guest in
# flight, QEMU's monitor still answering).
check "the guest starts" true
sleep 3600
