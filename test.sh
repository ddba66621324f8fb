#!/bin/bash
# Runs every test of weft: unit and in-memory protocol tests, seeded fuzz loops,
# a short cargo-fuzz smoke run of each fuzz target (when a nightly toolchain is
# available), the cluster tests on a real etcd, a benchmark smoke, the kernel-interop
# test (the Linux 6.1 NVMe/TCP host in a QEMU guest against weft), weft's initiator
# against the guest kernel's nvmet, the Linux host against a three-node cluster, the Linux
# 6.12 host (a Debian trixie guest) authenticating with DH-HMAC-CHAP and connecting over TLS,
# and smoke runs of the TLS and application benchmarks. Installs what it needs (Debian packages, the guest images,
# Go tools, cargo-fuzz) idempotently. Run as root from anywhere: ./test.sh
# Environment: WEFT_FUZZ_SECONDS (default 6 per target), WEFT_SIM_SEEDS (default 10000),
# WEFT_EC_SIM_SEEDS (default 2000; both simulations spread their seeds over the cores),
# WEFT_NEMESIS_SECONDS (default 90),
# WEFT_SKIP_VM=1 to skip the guest.
set -euo pipefail
cd "$(dirname "$0")"
# Each step says when it starts, and how long the run has taken (CI's budget: 60 minutes).
step() { printf '\n=== %s [%s, %d min in]\n' "$*" "$(date +%T)" $((SECONDS / 60)); }

step "host packages"
harness/deps.sh

step "build (release)"
cargo build --release --locked
cargo build --release --locked -p weft-initiator --examples

if [ "${WEFT_SKIP_VM:-}" != 1 ]; then
    # Downloading and unpacking Debian takes minutes that waiting steps can hide: the
    # guests' images are built in the background once the release build is done (beside
    # it, they made it 2 minutes longer), and the steps that boot a guest wait on the
    # image's lock (and build it themselves if this failed).
    step "guest images (6.1, 6.12, the applications') built in the background: .cache/vm/build-*.log"
    mkdir -p .cache/vm
    { harness/vm/build-image.sh && harness/vm/build-apps-image.sh; } > .cache/vm/build-bookworm.log 2>&1 &
    LAB_SUITE=trixie harness/vm/build-image.sh > .cache/vm/build-trixie.log 2>&1 &
fi

step "the CSI spec's csi.proto, fetched from the Go module proxy, matches crates/weft-csi/proto"
harness/csi-spec.sh

step "Kubernetes manifests (deploy/kubernetes), checked offline"
python3 harness/check-manifests.py

step "monitoring (deploy/monitoring): alerting rules checked and unit-tested by promtool, dashboards and rules against a real node and a real Prometheus"
python3 harness/check-monitoring.py

step "web dashboard (/ui/) in headless Chromium against a node with 1000 volumes"
# Debian's Python: python3-selenium is installed for it.
/usr/bin/python3 harness/check-ui.py --volumes 1000 --json .cache/ui/figures.json
step "web dashboard against a three-node cluster on etcd: acting from the page, a node killed shown down, its failover in the events"
/usr/bin/python3 harness/check-ui-cluster.py --json .cache/ui/cluster.json

step "the user guide: every command of README.md and docs/guide/ run against real nodes and etcd"
python3 harness/check-guide.py

step "cargo test (unit, protocol, seeded fuzz loops; two test binaries at a time: harness/cargo-test.py)"
python3 harness/cargo-test.py

step "replication simulation (VOPR-style): ${WEFT_SIM_SEEDS:=10000} seeds of crashes, pauses, power losses and partitions"
# A failing seed prints itself and how to replay it.
WEFT_SIM_SEEDS=$WEFT_SIM_SEEDS cargo test --release --locked -p weft-sim --test vopr seeds -- --nocapture

step "erasure-coded volume simulation: ${WEFT_EC_SIM_SEEDS:=2000} seeds of crashes tearing partial-stripe writes, pauses, cuts and failed disks"
WEFT_EC_SIM_SEEDS=$WEFT_EC_SIM_SEEDS cargo test --release --locked -p weft-sim --test ec seeds -- --nocapture

step "nemesis (short): etcd, three nodes and a writer under kill -9, hangs, partitions and restarts (the long run: harness/nemesis.sh --minutes 30)"
harness/nemesis.sh --seconds "${WEFT_NEMESIS_SECONDS:-90}" --json .cache/nemesis/smoke.json

step "fuzz smoke (cargo-fuzz, overflow checks and debug assertions on)"
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --quiet
    for target in decoders connection host authentication tls http_request volume_open tier_open; do
        # New inputs go to the first directory (git-ignored); the checked-in
        # seeds (fuzz/seeds/TARGET, recorded by weft-proto's tests) start the search.
        corpora=("corpus/$target")
        [ -d "fuzz/seeds/$target" ] && corpora+=("seeds/$target")
        mkdir -p "fuzz/corpus/$target"
        # No sanitizer: the fuzzed crates are safe Rust (weft's unsafe code is in weft-uring,
        # which no target reaches); overflow checks and debug assertions are what find bugs here.
        (cd fuzz && cargo +nightly fuzz run --sanitizer none --debug-assertions "$target" "${corpora[@]}" -- -max_total_time="${WEFT_FUZZ_SECONDS:-6}" -rss_limit_mb=4096 2>&1 | tail -n 3)
    done
else
    echo "skipped: no nightly toolchain (the seeded loops in cargo test ran)"
fi

step "fio's external I/O engine (libweft_fio.so) in Debian's fio against a weft node"
harness/fio-engine.sh

step "benchmark smoke: one reactor against one per CPU (the full run: harness/bench-reactors.sh)"
harness/bench-reactors.sh --runtime 1 --rounds 1

step "benchmark smoke: remote against local, and where an I/O's time goes (the full run: harness/bench-native.sh)"
harness/bench-native.sh --runtime 1 --rounds 1 --file-mib 64
step "benchmark smoke: control plane of a three-node cluster on etcd (the full run: harness/bench-cluster.py)"
python3 harness/bench-cluster.py --volumes 30 --hosts 10 --json .cache/bench/cluster/smoke.json
step "benchmark smoke: replicated volumes, one copy against three (the full run: harness/bench-replication.py)"
python3 harness/bench-replication.py --runtime 1s --rounds 1 --failovers 1 --read-runtime 500ms --json .cache/bench/replication/smoke.json
step "benchmark smoke: replication links in TLS against the clear, two clusters side by side (the full run: harness/bench-tls-links.py)"
python3 harness/bench-tls-links.py --runtime 1s --rounds 1 --json .cache/bench/tls-links/smoke.json

step "benchmark smoke: an erasure-coded 2+1 volume beside one copy and three replicas (the full run: harness/bench-erasure.py)"
python3 harness/bench-erasure.py --runtime 1s --rounds 1 --json .cache/bench/erasure/smoke.json
step "benchmark smoke: encrypted volumes against the clear (the full run: harness/bench-encryption.py)"
python3 harness/bench-encryption.py --runtime 1s --rounds 1 --json .cache/bench/encryption/smoke.json
step "benchmark smoke: a pool with a write tier beside one without (the full run: harness/bench-tier.py)"
python3 harness/bench-tier.py --runtime 1s --rounds 1 --tier-mib 32 --json .cache/bench/tier/smoke.json
step "benchmark smoke: compressed volumes (lz4, zstd) beside one that is not, on data 0%, 50% and 90% compressible, in a pool and in one with a write tier (the full run: harness/bench-compression.py)"
python3 harness/bench-compression.py --runtime 1s --rounds 1 --size-mib 32 --tier-mib 64 --json .cache/bench/compression/smoke.json
step "benchmark smoke: weft beside Ceph RBD (16.2, started by hand on loopback), fio against both, and kill -9 of the primary under a writer (the full run: harness/bench-peers.py)"
python3 harness/bench-peers.py --runtime 1 --rounds 1 --size-mib 128 --osd-gib 2 --outage 2 --failover kill --json .cache/bench/peers/smoke.json
step "benchmark smoke: how the control plane's costs grow with nodes and volumes, a three-member etcd and six nodes (the full run: harness/bench-scale.py, 32 nodes)"
python3 harness/bench-scale.py --nodes 6 --counts 30,90 --hosts 20 --json .cache/bench/scale/smoke.json

if [ "${WEFT_SKIP_VM:-}" = 1 ]; then
    step "kernel interop skipped (WEFT_SKIP_VM=1)"
else
    step "kernel interop (Linux 6.1 host in a QEMU guest)"
    harness/interop.sh --weft target/release/weft
    step "weft's initiator against the Linux kernel's nvmet (in the QEMU guest)"
    harness/initiator-peers.sh
    step "a weft cluster (etcd and three nodes) from the Linux host: referrals, connect-all, fio verify"
    harness/cluster-interop.sh --weft target/release/weft
    step "benchmark smoke: discovery connections of the Linux host's nvme connect-all through the referrals of six nodes (the full run: harness/bench-discovery.py)"
    python3 harness/bench-discovery.py --nodes 6 --json .cache/bench/discovery/smoke.json
    step "DH-HMAC-CHAP and TLS from the Linux 6.12 host (Debian trixie guest): bidirectional, host-only, FFDHE, TLS 1.3, the CSI node plugin's per-node secrets, refusals"
    harness/auth-interop.sh --weft target/release/weft
    step "benchmark smoke: NVMe/TCP TLS against the clear from the Linux 6.12 host (the full run: harness/bench-tls.sh)"
    harness/bench-tls.sh --rounds 1 --seconds 2 --json .cache/bench/tls/smoke.json
    step "benchmark smoke: weft's initiator over TLS against the clear on loopback (the full run: harness/bench-tls-loopback.sh)"
    harness/bench-tls-loopback.sh --rounds 1 --seconds 1 --json .cache/bench/tls-loopback/smoke.json
    step "benchmark smoke: RocksDB, sysbench and YCSB on weft and on a local disk in the guest (the full run, TPC-C too: harness/bench-apps.sh)"
    harness/bench-apps.sh --smoke
fi
step "all tests passed"
