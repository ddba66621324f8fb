#!/bin/bash
# Build weft's test guest: a minimal Debian bookworm rootfs (debootstrap) with the
# stock Debian 6.1 kernel, nvme-cli, fio, ... packed as an ext4 image; with
# LAB_SUITE=trixie, Debian 13 with Linux 6.12 (NVMe in-band authentication and TLS),
# cached apart.
# Adapted from the shared lab recipe (../shared/lab/build-rootfs.sh).
#
# Usage: harness/vm/build-image.sh [--force]   (root; needs Debian's package mirror)
# Idempotent: the image lives in .cache/vm/<recipe hash>/ (git-ignored) and is
# rebuilt only when this recipe (this file, guest-init, mk-initramfs.py) changes.
# Prints the image directory on its last line. Outputs in that directory:
#   rootfs.ext4    root filesystem image (booted with snapshot=on, never modified)
#   vmlinux        uncompressed kernel (PVH entry), what vm-run.sh boots
#   initrd-lab.img small busybox initramfs (mk-initramfs.py)
#   kernel-config, kernel-version
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE"
OUT=$("$HERE/image-dir.sh")
if [ "${1:-}" != "--force" ] && [ -e "$OUT/.complete" ]; then echo "$OUT"; exit 0; fi
exec 3>&1 1>&2   # progress on stderr; the image directory alone on stdout
mkdir -p "$OUT"
exec 9>"$OUT.lock"; flock 9
# Built while we waited (test.sh builds the images in the background from its start).
if [ "${1:-}" != "--force" ] && [ -e "$OUT/.complete" ]; then echo "$OUT" >&3; exit 0; fi
cd "$OUT"

SUITE=${LAB_SUITE:-bookworm}
MIRROR=${LAB_MIRROR:-http://deb.debian.org/debian}
ROOT=rootfs
PKGS=linux-image-amd64,nvme-cli,fio,kmod,iproute2,e2fsprogs,procps,python3,util-linux,initramfs-tools,ca-certificates,iputils-ping,strace,pciutils
# The Linux host's NVMe/TCP TLS: tlshd does the handshake for the kernel (trixie on).
[ "$SUITE" = bookworm ] || PKGS=$PKGS,ktls-utils,keyutils

need() { command -v "$1" >/dev/null 2>&1; }
if ! need debootstrap || ! need qemu-system-x86_64 || ! need mkfs.ext4; then
    echo "[build] installing host packages"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        qemu-system-x86 qemu-utils debootstrap e2fsprogs cpio iproute2 python3
fi

if [ "${1:-}" = "--force" ]; then rm -rf "$ROOT" rootfs.ext4 .complete; fi
if [ ! -x "$ROOT/usr/bin/fio" ]; then
    rm -rf "$ROOT"
    echo "[build] debootstrap $SUITE -> $ROOT"
    debootstrap --variant=minbase --include="$PKGS" "$SUITE" "$ROOT" "$MIRROR"
fi

echo "[build] configuring guest"
# Trim: package cache, docs, and kernel modules no test here needs (graphics,
# media, sound, wireless, ...). Everything storage/network/RDMA related stays.
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*_Packages \
       "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT"/usr/share/locale/* "$ROOT"/usr/share/info/*
for KV in "$ROOT"/lib/modules/*; do
    K=$KV/kernel
    rm -rf "$K"/drivers/{gpu,media,staging,iio,bluetooth,isdn,input/touchscreen,net/wireless,net/can,net/usb} \
           "$K"/sound "$K"/net/{wireless,mac80211,bluetooth,6lowpan,ieee802154,mac802154}
    chroot "$ROOT" depmod "${KV##*/}"
done
# Small initrd: only what is needed to mount an ext4 root on virtio-blk.
cat > "$ROOT/etc/initramfs-tools/conf.d/lab.conf" <<'EOC'
MODULES=list
COMPRESS=gzip
EOC
cat > "$ROOT/etc/initramfs-tools/modules" <<'EOC'
virtio_pci
virtio_blk
ext4
EOC
echo lab > "$ROOT/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 lab\n::1 localhost\n' > "$ROOT/etc/hosts"
printf '/dev/vda / ext4 rw 0 1\n' > "$ROOT/etc/fstab"
: > "$ROOT/etc/resolv.conf"
install -m 0755 "$HERE/guest-init" "$ROOT/sbin/lab-init"
mkdir -p "$ROOT/mnt/share" "$ROOT/mnt/weft"
# nvme-cli host identity (normally created by the package postinst)
mkdir -p "$ROOT/etc/nvme"
[ -s "$ROOT/etc/nvme/hostnqn" ] || chroot "$ROOT" nvme gen-hostnqn > "$ROOT/etc/nvme/hostnqn"
[ -s "$ROOT/etc/nvme/hostid" ] || python3 -c 'import uuid;print(uuid.uuid4())' > "$ROOT/etc/nvme/hostid"

KVER=$(ls "$ROOT/lib/modules" | sort -V | tail -1)
if [ ! -e "$ROOT/boot/.lab-initrd-$KVER" ] || [ "$ROOT/etc/initramfs-tools/modules" -nt "$ROOT/boot/.lab-initrd-$KVER" ]; then
    echo "[build] update-initramfs for $KVER"
    chroot "$ROOT" update-initramfs -u -k "$KVER"
    touch "$ROOT/boot/.lab-initrd-$KVER"
fi
cp "$ROOT/boot/vmlinuz-$KVER" vmlinuz
# Uncompressed ELF kernel, booted through its PVH entry point (qemu -kernel
# vmlinux). On machines whose nested KVM is kvm_pvm, the bzImage decompressor
# runs for many minutes; the PVH entry skips it.
python3 - vmlinuz vmlinux <<'EOP'
import lzma, sys
data = open(sys.argv[1], 'rb').read()
for magic, fmt in ((b'\xfd7zXZ\x00', lzma.FORMAT_XZ),):
    i = data.find(magic)
    if i >= 0:
        out = lzma.LZMADecompressor(format=fmt).decompress(data[i:])
        assert out[:4] == b'\x7fELF', 'not an ELF kernel'
        open(sys.argv[2], 'wb').write(out)
        break
else:
    # trixie's kernels are zstd-compressed.
    import subprocess
    i = data.find(b'\x28\xb5\x2f\xfd')
    if i < 0:
        sys.exit('extract-vmlinux: no xz or zstd payload found')
    out = subprocess.run(['zstd', '-dc'], input=data[i:], capture_output=True).stdout
    assert out[:4] == b'\x7fELF', 'not an ELF kernel'
    open(sys.argv[2], 'wb').write(out)
EOP
cp "$ROOT/boot/initrd.img-$KVER" initrd.img
cp "$ROOT/boot/config-$KVER" kernel-config
# static busybox for the small initramfs, from Debian's busybox-static package
if [ ! -x pkgs/bb/bin/busybox ]; then
    mkdir -p pkgs
    (cd pkgs && { apt-get download busybox-static || { apt-get update && apt-get download busybox-static; }; } && dpkg-deb -x busybox-static_*.deb bb)
fi
python3 "$HERE/mk-initramfs.py" "$ROOT" "$KVER" pkgs/bb/bin/busybox initrd-lab.img
echo "$KVER" > kernel-version

echo "[build] mkfs.ext4 -d"
SIZE_MB=$(( $(du -sm "$ROOT" | cut -f1) + 512 ))
rm -f rootfs.ext4.tmp
mkfs.ext4 -q -F -L labroot -d "$ROOT" rootfs.ext4.tmp "${SIZE_MB}M"
mv rootfs.ext4.tmp rootfs.ext4
# the debootstrap tree is only an intermediate: drop it once the image exists
rm -rf "$ROOT" pkgs vmlinuz initrd.img
echo "$SUITE" > suite
touch .complete
# older images of this suite (other recipe hashes) are no longer used
for d in "$(dirname "$OUT")"/*; do
    # Only finished images: another suite's may be building beside this one.
    [ -d "$d" ] && [ "$d" != "$OUT" ] && [ -e "$d/.complete" ] || continue
    [ "$(cat "$d/suite" 2>/dev/null || echo bookworm)" = "$SUITE" ] && rm -rf "$d" "$d.lock"
done
echo "[build] done (kernel $KVER)" >&2
echo "$OUT" >&3
