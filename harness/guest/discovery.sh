#!/bin/bash
# Discovery through referrals, guest side (started by harness/bench-discovery.py): a cluster
# of WEFT_NODES weft nodes on the host (reached as $LAB_HOST_IP, node 1's NVMe/TCP port
# WEFT_PORT), no volume for this host. One `nvme connect-all` against node 1, as a host
# would be set up, follows the referrals of every discovery log it reads; the kernel logs
# each controller it creates ("new ctrl: NQN ..."), so the discovery controllers in the
# log are the discovery connections the host made. Prints
# "discovery: nodes N connections C reached R seconds S" and "discovery: PASS".
set -uo pipefail
ADDR=${LAB_HOST_IP:?needs slirp}
PORT=${WEFT_PORT:?} NODES=${WEFT_NODES:?}
modprobe nvme-tcp
[ -s /etc/nvme/hostnqn ] || { mkdir -p /etc/nvme && nvme gen-hostnqn > /etc/nvme/hostnqn; }
dmesg -C
start=$(date +%s%N)
timeout 600 nvme connect-all -t tcp -a "$ADDR" -s "$PORT"
rc=$?
end=$(date +%s%N)
discovery='new ctrl: NQN "nqn.2014-08.org.nvmexpress.discovery"'
connections=$(dmesg | grep -c "$discovery")
# Which nodes it reached: the distinct addresses of those controllers.
reached=$(dmesg | grep "$discovery" | grep -o 'addr [0-9.]*:[0-9]*' | sort -u | wc -l)
echo "discovery: nodes $NODES connections $connections reached $reached ms $(((end - start) / 1000000))"
nvme disconnect-all > /dev/null 2>&1
if [ "$rc" = 0 ] && [ "$reached" = "$NODES" ]; then
    echo "discovery: PASS"
else
    echo "discovery: FAIL (nvme connect-all exit $rc, $reached of $NODES nodes reached)"
    dmesg | tail -20
fi
