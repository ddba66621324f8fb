#!/bin/bash
# Installs the Debian packages weft's tests need on the host, only those missing:
# qemu (the guest), debootstrap/e2fsprogs/cpio (the guest image), iproute2, a C compiler
# (ring, the API's TLS crypto, builds C), openssl (the API TLS test makes a certificate; it and
# gnutls-cli are the NVMe/TCP TLS tests' peers),
# protoc and its well-known types (etcd-client compiles etcd's gRPC API at build time) and etcd with etcdctl (the
# cluster store's tests run real members; harness/etcd.sh starts them by hand), fio (it
# loads weft's external I/O engine, libweft_fio.so) and prometheus (its promtool checks the
# alerting rules), Ceph (the peer weft is measured beside).
# The guest image itself carries nvme-cli and fio (harness/vm/build-image.sh).
set -euo pipefail
missing=()
need() { command -v "$1" >/dev/null 2>&1 || missing+=("$2"); }
need qemu-system-x86_64 qemu-system-x86
need qemu-img qemu-utils
need debootstrap debootstrap
need mkfs.ext4 e2fsprogs
# trixie's kernel (the Linux 6.12 guest) is zstd-compressed.
need zstd zstd
need cpio cpio
need ip iproute2
need python3 python3
need flock util-linux
need cc gcc
# The zstd crate links Debian's libzstd (found with pkg-config) instead of compiling zstd's C
# in every profile that builds it.
need pkg-config pkg-config
pkg-config --exists libzstd 2>/dev/null || missing+=(libzstd-dev)
need openssl openssl
# The TLS tests' peers: GnuTLS as the Linux host's tlshd drives it (crates/weft-proto/tests/tls_peers.rs).
need gnutls-cli gnutls-bin
need protoc protobuf-compiler
need etcd etcd-server
# protoc's well-known types (google/protobuf/descriptor.proto), which etcd's API imports:
# a recommendation of protobuf-compiler, so not installed with it here.
[ -f /usr/include/google/protobuf/descriptor.proto ] || missing+=(libprotobuf-dev)
# harness/check-manifests.py reads deploy/kubernetes/ with PyYAML.
python3 -c 'import yaml' 2>/dev/null || missing+=(python3-yaml)
need etcdctl etcd-client
# Debian's fio loads weft's external I/O engine (harness/fio-engine.sh).
need fio fio
# promtool checks and unit-tests deploy/monitoring's alerting rules (harness/check-monitoring.py).
need promtool prometheus
# The web dashboard's test drives headless Chromium with Selenium (harness/check-ui.py).
need chromium chromium
need chromedriver chromium-driver
/usr/bin/python3 -c 'import selenium' 2>/dev/null || missing+=(python3-selenium)
# Ceph 16.2, started by hand beside weft (harness/bench-peers.py); ceph-common brings
# librbd, which Debian's fio loads for its rbd engine.
need ceph-mon ceph-mon
need ceph-mgr ceph-mgr
need ceph-osd ceph-osd
need rbd ceph-common
if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: installing ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
else
    echo "deps: all present"
fi
