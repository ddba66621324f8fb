#!/bin/bash
# The application benchmark's guest (harness/bench-apps.sh): the test guest's image
# (build-image.sh) with RocksDB's db_bench (rocksdb-tools), sysbench and MariaDB installed,
# in a directory of its own: .cache/vm-apps/<hash of the base image's recipe and this file>/.
# The test guest itself stays as small as it is. Built once (a loop mount and apt in a
# chroot, a few minutes); prints the image directory on its last line.
# Usage (root): harness/vm/build-apps-image.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BASE=$("$HERE/build-image.sh")
HASH=$( (basename "$BASE"; cat "$0") | sha256sum | cut -c1-16)
OUT=$REPO/.cache/vm-apps/$HASH
if [ -e "$OUT/.complete" ]; then echo "$OUT"; exit 0; fi
exec 3>&1 1>&2
mkdir -p "$OUT"
exec 9>"$OUT.lock"; flock 9
if [ -e "$OUT/.complete" ]; then echo "$OUT" >&3; exit 0; fi   # built while we waited
ROOT=$OUT/mnt
unmount_all() { # everything mounted under ROOT (also what an interrupted run left)
    findmnt -rn -o TARGET | { grep -F "$ROOT" || true; } | sort -r | while read -r m; do
        umount "$m" 2>/dev/null || umount -l "$m"
    done
}
unmount_all
cd "$OUT"
PKGS=(rocksdb-tools sysbench mariadb-server mariadb-client)
echo "[apps] $BASE/rootfs.ext4 + ${PKGS[*]}"
cp --sparse=always "$BASE/rootfs.ext4" rootfs.ext4.tmp
truncate -s +2G rootfs.ext4.tmp
e2fsck -fy rootfs.ext4.tmp > /dev/null || [ $? -le 1 ]
resize2fs -f rootfs.ext4.tmp > /dev/null
mkdir -p "$ROOT"
mount -o loop rootfs.ext4.tmp "$ROOT"
trap unmount_all EXIT
mount -t proc proc "$ROOT/proc"; mount -t sysfs sys "$ROOT/sys"
mount --bind /dev "$ROOT/dev"; mount --bind /dev/pts "$ROOT/dev/pts"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
# No service starts inside the chroot (MariaDB's postinst would start its server).
printf '#!/bin/sh\nexit 101\n' > "$ROOT/usr/sbin/policy-rc.d"; chmod +x "$ROOT/usr/sbin/policy-rc.d"
chroot "$ROOT" apt-get update -q
chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PKGS[@]}"
chroot "$ROOT" apt-get clean
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/* "$ROOT/usr/sbin/policy-rc.d"
: > "$ROOT/etc/resolv.conf"
unmount_all
trap - EXIT
if findmnt -rn -o TARGET | grep -qF "$ROOT"; then echo "[apps] $ROOT is still mounted" >&2; exit 1; fi
e2fsck -fy rootfs.ext4.tmp > /dev/null || [ $? -le 1 ]
mv rootfs.ext4.tmp rootfs.ext4
rmdir "$ROOT"
for f in vmlinux initrd-lab.img kernel-version kernel-config; do cp "$BASE/$f" .; done
touch .complete
# older application images (other hashes) are no longer used
# (--one-file-system: never into anything still mounted there)
for d in "$(dirname "$OUT")"/*; do [ "$d" = "$OUT" ] || [ "$d" = "$OUT.lock" ] || rm -rf --one-file-system "$d"; done
echo "[apps] done" >&2
echo "$OUT" >&3
