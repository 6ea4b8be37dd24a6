#!/bin/bash
# PID 1 of a real test node: runs in PID, mount, network and UTS namespaces of its own
# (unshare --pid --fork --mount-proc --mount --net --uts), so the node's "host" as a
# privileged hostPID pod sees it is this process, not the CI machine's init. Nothing here
# changes the CI machine: sysctls and routes are the node's network namespace's, /run is
# a tmpfs, and /etc, /var/lib, /var/log are the node's own directories bind-mounted over
# the machine's. `systemctl` is a fake that records what it is asked (a reboot request is
# the harness's cue to restart the node). The node's kernel modules are its own too: a
# /sys/module the harness and the `modprobe`/`depmod` shims write, holding no loaded
# module at every boot as a kernel's would, over the machine's real entries; and a
# /lib/modules of its own, so an installed module never lands on the machine.
# Inputs (environment): NODE (directory), NAME, NODE_IP, HOST_IP, API_PORT, KTEST,
# KUBELET_PORT.
set -euo pipefail
N="$NODE"

mount --make-rprivate /
mount -t tmpfs -o mode=755 tmpfs /run
mount --bind "$N/etc" /etc
mount --bind "$N/var-lib" /var/lib
mount --bind "$N/var-log" /var/log
mount --bind "$N/bin/systemctl" /usr/bin/systemctl
# This boot's ID, and the three kernel settings the kubelet insists on reading as it
# wants them (protectKernelDefaults): read here, never written to the machine.
mount --bind "$N/boot_id" /proc/sys/kernel/random/boot_id
mount --bind "$N/fake/overcommit_memory" /proc/sys/vm/overcommit_memory
mount --bind "$N/fake/panic" /proc/sys/kernel/panic
mount --bind "$N/fake/panic_on_oops" /proc/sys/kernel/panic_on_oops
# Kernel modules: this boot's /sys/module is the node's own directory, each of the
# machine's real entries bound into it (what runc or the kubelet may look for stays).
rm -rf "$N/kmod"
mkdir -p "$N/kmod/sys-module"
for d in /sys/module/*; do
  mkdir "$N/kmod/sys-module/${d##*/}"
  mount --bind "$d" "$N/kmod/sys-module/${d##*/}"
done
mount --rbind "$N/kmod/sys-module" /sys/module
# A machine directory made the node's own: an overlay whose changes go to the node's
# upper layer, never to the machine.
own() {
  local dir up
  dir="$(readlink -f "$1")"
  up="$N/overlay/$2"
  mkdir -p "$up/upper" "$up/work"
  mount -t overlay "nodewright-node-$2" -o "lowerdir=$dir,upperdir=$up/upper,workdir=$up/work" "$dir"
}
own /sbin sbin
ln -sfn "$N/bin/modprobe" /sbin/modprobe
ln -sfn "$N/bin/depmod" /sbin/depmod
[ -d /lib/modules ] || { own /lib lib; mkdir -p /lib/modules; }
mount --bind "$N/lib-modules" /lib/modules
hostname "$NAME"
echo $$ > "$N/state/pid1-inside"

# The link the harness moves in; then addresses, the route out, and the one Service
# pods need (the apiserver's ClusterIP, since no kube-proxy runs).
for _ in $(seq 1 600); do ip link show nwn0 >/dev/null 2>&1 && break; sleep 0.05; done
ip link set lo up
ip addr add "$NODE_IP/30" dev nwn0
ip link set nwn0 up
ip route add default via "$HOST_IP"
echo 1 > /proc/sys/net/ipv4/ip_forward
iptables -t nat -A PREROUTING -d 10.0.0.1 -p tcp --dport 443 -j DNAT --to-destination "$HOST_IP:$API_PORT"
iptables -t nat -A OUTPUT -d 10.0.0.1 -p tcp --dport 443 -j DNAT --to-destination "$HOST_IP:$API_PORT"

containerd --config "$N/containerd/config.toml" > "$N/containerd.log" 2>&1 &
for _ in $(seq 1 600); do [ -S "$N/containerd/containerd.sock" ] && break; sleep 0.05; done

"$KTEST" kubelet --config="$N/kubelet/config.yaml" --root-dir="$N/kubelet/root" --cert-dir="$N/kubelet/pki" \
  --kubeconfig="$N/kubelet/kubeconfig" --hostname-override="$NAME" --node-ip="$NODE_IP" --v=1 \
  > "$N/kubelet.log" 2>&1 &
echo ready > "$N/state/started"
# PID 1: reap whatever is orphaned here until the harness ends this namespace.
while true; do wait -n || true; sleep 1; done
