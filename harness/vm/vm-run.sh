#!/bin/bash
# Boot weft's test guest (Debian bookworm, kernel 6.1) under qemu and run SCRIPT in it.
# Adapted from the shared lab recipe (../shared/lab/vm-run.sh); the image comes from
# build-image.sh (cached under .cache/vm/<recipe hash>/). The repository is shared
# read-only as /mnt/weft, so the guest can run target/*/weft and harness/guest/*.
#
# Usage: ./vm-run.sh [options] SCRIPT [ARGS...]
#   -n, --net MODE      slirp (default): qemu user-mode net; guest 10.0.2.15, the
#                         host's 127.0.0.1 is reachable from the guest as 10.0.2.2
#                       tap: guest on a tap device inside network namespace NS;
#                         guest 10.77.0.2, host side 10.77.0.1 (only inside NS)
#                       none: no network card
#   -p, --fwd HP:GP     slirp only: forward host 127.0.0.1:HP to guest port GP
#                       (repeatable), e.g. to reach a target running in the guest;
#                       in tap mode the guest is reachable as 10.77.0.2 inside NS
#   -H, --host-cmd CMD  run CMD (sh -c, cwd = this directory) on the host side before
#                       booting, inside the network namespace in tap mode; it is
#                       killed (whole process group) after the VM ends
#   -t, --timeout SEC   kill the VM after SEC seconds (default 900); exit code 124
#   -m, --mem MB        guest memory (default 4096)
#   -c, --cpus N        guest vCPUs (default 2)
#   -s, --share DIR     host directory shared read-write as /mnt/share (default .cache/vm-share)
#   -e, --env NAME=VAL  environment variable for SCRIPT in the guest (repeatable)
#       --ns NAME       network namespace for tap mode (default lab)
#       --tcg / --kvm   force the accelerator (default: KVM if usable, see below)
#   -v, --verbose       full kernel boot log on the console
# In the guest SCRIPT runs under bash as root with cwd /mnt/share and the
# environment LAB_NET, LAB_HOST_IP, LAB_GUEST_IP, LAB_SHARE=/mnt/share and
# WEFT_DIR=/mnt/weft (the repository, read-only). Its output is streamed to stdout
# and saved in SHARE/.lab/console.log; vm-run.sh exits with its exit code.
# Extra qemu arguments may be given in LAB_QEMU_EXTRA, extra kernel parameters in
# LAB_APPEND, the accelerator in LAB_ACCEL (kvm|tcg), the CPU model in LAB_CPU, the
# initrd in LAB_INITRD (lab = build/initrd-lab.img, default; debian = build/initrd.img),
# another image directory in LAB_IMAGE_DIR (default: build-image.sh's; the application
# benchmark boots build-apps-image.sh's).
set -uo pipefail
LAB=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$LAB/../.." && pwd)
IMG=${LAB_IMAGE_DIR:-$("$LAB/image-dir.sh")}

GUEST_ENV=() FWD=
NET=slirp HOSTCMD= TIMEOUT=900 MEM=4096 CPUS=2 SHARE=$REPO/.cache/vm-share NS=lab ACCEL=${LAB_ACCEL:-auto} VERBOSE=
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        -n|--net) NET=$2; shift 2 ;;
        -H|--host-cmd) HOSTCMD=$2; shift 2 ;;
        -p|--fwd) FWD+=",hostfwd=tcp:127.0.0.1:${2%%:*}-:${2##*:}"; shift 2 ;;
        -t|--timeout) TIMEOUT=$2; shift 2 ;;
        -m|--mem) MEM=$2; shift 2 ;;
        -c|--cpus) CPUS=$2; shift 2 ;;
        -s|--share) SHARE=$2; shift 2 ;;
        -e|--env) GUEST_ENV+=("$2"); shift 2 ;;
        --ns) NS=$2; shift 2 ;;
        --tcg) ACCEL=tcg; shift ;;
        --kvm) ACCEL=kvm; shift ;;
        -v|--verbose) VERBOSE=1; shift ;;
        -h|--help) usage ;;
        --) shift; break ;;
        -*) echo "unknown option $1" >&2; usage ;;
        *) break ;;
    esac
done
[ $# -ge 1 ] || usage
SCRIPT=$1; shift
[ -r "$SCRIPT" ] || { echo "vm-run: no such script: $SCRIPT" >&2; exit 2; }
case "${LAB_INITRD:-lab}" in
    lab) INITRD=initrd-lab.img ;;     # small busybox initramfs (fast)
    debian) INITRD=initrd.img ;;      # Debian's initramfs-tools initrd (udev; slower)
    *) echo "vm-run: LAB_INITRD must be lab or debian" >&2; exit 2 ;;
esac
for f in vmlinux "$INITRD" rootfs.ext4; do
    [ -r "$IMG/$f" ] || { echo "vm-run: $IMG/$f missing, run harness/vm/build-image.sh first" >&2; exit 2; }
done

mkdir -p "$SHARE/.lab"
SHARE=$(cd "$SHARE" && pwd)
rm -f "$SHARE/.lab/rc" "$SHARE/.lab/console.log"
cp "$SCRIPT" "$SHARE/.lab/script"
{
    for e in "${GUEST_ENV[@]}"; do printf 'export %q\n' "$e"; done
    printf 'set --'; for a in "$@"; do printf ' %q' "$a"; done; echo
} > "$SHARE/.lab/args"

# Accelerator. "auto" uses KVM when /dev/kvm is usable, except where KVM is the
# kvm_pvm module (nested PVM, as on the development machines): PVM
# runs only PVM-aware guest kernels; the stock Debian kernel hits "KVM internal
# error ... emulation failure" (cmpxchg16b, xrstor, int3) and boots at a crawl.
if [ "$ACCEL" = auto ]; then
    if [ -r /dev/kvm ] && [ -w /dev/kvm ] && [ ! -d /sys/module/kvm_pvm ]; then ACCEL=kvm; else ACCEL=tcg; fi
fi
if [ "$ACCEL" = kvm ]; then
    ACCEL_ARGS=(-accel kvm -cpu "${LAB_CPU:-host}")
else
    # multi-threaded TCG: one host thread per vCPU
    ACCEL_ARGS=(-accel tcg,thread=multi,tb-size=512 -cpu "${LAB_CPU:-max,-monitor}")
fi

CMDLINE="console=ttyS0 root=/dev/vda rw rootfstype=ext4 init=/sbin/lab-init panic=-1 nokaslr mitigations=off"
CMDLINE="$CMDLINE ${LAB_APPEND:-}"
if [ -n "$VERBOSE" ]; then CMDLINE="$CMDLINE earlyprintk=serial,ttyS0"; else CMDLINE="$CMDLINE quiet loglevel=3"; fi
NS_EXEC=()
CREATED_NS=
case "$NET" in
    slirp)
        NET_ARGS=(-netdev "user,id=n0,net=10.0.2.0/24,host=10.0.2.2$FWD" -device virtio-net-pci,netdev=n0)
        CMDLINE="$CMDLINE lab.net=slirp lab.ip=10.0.2.15/24 lab.hostip=10.0.2.2" ;;
    tap)
        if ! ip netns list | grep -qw "^$NS"; then
            ip netns add "$NS" || exit 1
            CREATED_NS=1
        fi
        ip -n "$NS" link set lo up
        ip -n "$NS" link show labtap0 >/dev/null 2>&1 || ip -n "$NS" tuntap add dev labtap0 mode tap || exit 1
        ip -n "$NS" addr replace 10.77.0.1/24 dev labtap0
        ip -n "$NS" link set labtap0 up
        NS_EXEC=(ip netns exec "$NS")
        NET_ARGS=(-netdev tap,id=n0,ifname=labtap0,script=no,downscript=no -device virtio-net-pci,netdev=n0)
        CMDLINE="$CMDLINE lab.net=tap lab.ip=10.77.0.2/24 lab.hostip=10.77.0.1" ;;
    none)
        NET_ARGS=(-nic none)
        CMDLINE="$CMDLINE lab.net=none" ;;
    *) echo "vm-run: bad --net $NET" >&2; exit 2 ;;
esac

HOSTPID= QPID=
cleanup() {
    if [ -n "$QPID" ]; then
        kill "$QPID" 2>/dev/null
        wait "$QPID" 2>/dev/null
    fi
    if [ -n "$HOSTPID" ]; then
        kill -- -"$HOSTPID" 2>/dev/null || kill "$HOSTPID" 2>/dev/null
        wait "$HOSTPID" 2>/dev/null
    fi
    if [ -n "$CREATED_NS" ] && [ -z "${LAB_KEEP_NETNS:-}" ]; then
        ip netns del "$NS" 2>/dev/null
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
if [ -n "$HOSTCMD" ]; then
    # own process group so that cleanup can end everything it started
    # (runs with this directory as cwd, so relative paths like tools/... work)
    (cd "$REPO" && exec setsid "${NS_EXEC[@]}" sh -c "$HOSTCMD") &
    HOSTPID=$!
    sleep "${LAB_HOST_CMD_DELAY:-0.5}"
fi

# A guest whose kernel dies before its init ran (TCG now and then faults while the
# kernel patches its own text at boot: "Oops: int3" in the first seconds) is booted
# once more; any later failure is the test's.
for BOOT in 1 2; do
T0=$(date +%s.%N)
echo "[vm-run] accel=$ACCEL net=$NET cpus=$CPUS mem=${MEM}M share=$SHARE timeout=${TIMEOUT}s" >&2
timeout -k 5 "$TIMEOUT" "${NS_EXEC[@]}" qemu-system-x86_64 \
    -name lab -machine "${LAB_MACHINE:-q35}" "${ACCEL_ARGS[@]}" -smp "$CPUS${LAB_SMP_EXTRA:-}" -m "$MEM" \
    -nodefaults -no-user-config -display none -vga none -no-reboot \
    -serial stdio -monitor none \
    -kernel "$IMG/vmlinux" -initrd "$IMG/$INITRD" -append "$CMDLINE" \
    -drive file="$IMG/rootfs.ext4",format=raw,if=virtio,snapshot=on,cache=unsafe \
    -virtfs local,path="$SHARE",mount_tag=share,security_model=none,id=share \
    -virtfs local,path="$REPO",mount_tag=weft,security_model=none,readonly=on,id=weft \
    -device virtio-rng-pci \
    "${NET_ARGS[@]}" ${LAB_QEMU_EXTRA:-} </dev/null &
QPID=$!
wait "$QPID"
QRC=$?
QPID=
T1=$(date +%s.%N)
printf '[vm-run] qemu exited (%s) after %.1fs\n' "$QRC" "$(awk "BEGIN{print $T1-$T0}")" >&2
if [ "$BOOT" = 1 ] && [ "$QRC" != 124 ] && [ "$QRC" != 137 ] && [ ! -e "$SHARE/.lab/console.log" ]; then
    echo "[vm-run] the guest died before its init ran: booting it once more" >&2
    continue
fi
break
done
if [ "$QRC" = 124 ] || [ "$QRC" = 137 ]; then
    echo "[vm-run] TIMEOUT after ${TIMEOUT}s" >&2
    exit 124
fi
if [ -r "$SHARE/.lab/rc" ]; then
    exit "$(cat "$SHARE/.lab/rc")"
fi
echo "[vm-run] guest did not report an exit code (qemu rc $QRC)" >&2
exit 125
