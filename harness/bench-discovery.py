#!/usr/bin/env python3
"""Discovery connections a host makes through the referrals: for each cluster size
in NODES, a three-member etcd and that many `weft serve` nodes on loopback
(bench-scale.py's cluster, advertising 10.0.2.2, the host as the QEMU guest sees
it), then the Linux host in the guest (harness/guest/discovery.sh) runs one
`nvme connect-all` against node 1 and counts the discovery controllers its
kernel created, and the nodes they reached.

Up to three nodes every node refers to all others; nvme-cli visits one discovery
controller per simple path through the referrals (5 connections for 3 nodes, and
it would be 16 for 4); beyond, each node refers to its successor in a ring, one
connection per node (weft-node/src/cluster.rs, referral_keeper).

Prints a table and writes JSON (default .cache/bench/discovery/result.json).

Usage: harness/bench-discovery.py [--weft target/release/weft] [--nodes 3,4,8,32]
       [--json FILE]   (as root: it boots the guest; --nodes 6 is the smoke)
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

from harness_module import load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
bench_scale = load("bench-scale")


def measure(weft, nodes, work):
    """Starts a cluster of `nodes` nodes and has the guest connect-all against
    node 1: {"nodes", "connections", "reached", "ms"}."""
    data = os.path.join("/dev/shm", "weft-bench-discovery")
    shutil.rmtree(data, ignore_errors=True)
    cluster = bench_scale.ScaleCluster(weft, work, nodes, data, 10000)
    cluster.serve_args = ["--advertise", "10.0.2.2"]
    share = os.path.join(work, "share")
    os.makedirs(share, exist_ok=True)
    try:
        cluster.start()
        # Referrals name the nodes that are up: wait until n1 sees them all.
        cluster.wait(lambda: sum(n["state"] == "up" for n in cluster.must(
            cluster.nodes[0], "GET", "nodes")) == nodes, "every node up", limit=120)
        run = subprocess.run(
            [os.path.join(ROOT, "harness/vm/vm-run.sh"), "-n", "slirp", "-s", share,
             "-t", "900", "-e", f"WEFT_PORT={bench_scale.NVME}", "-e", f"WEFT_NODES={nodes}",
             os.path.join(ROOT, "harness/guest/discovery.sh")],
            capture_output=True, text=True)
    finally:
        cluster.stop()
    console = run.stdout + run.stderr
    found = re.search(r"discovery: nodes (\d+) connections (\d+) reached (\d+) ms (\d+)", console)
    if run.returncode != 0 or not found or "discovery: PASS" not in console:
        sys.exit(f"bench-discovery: the guest failed with {nodes} nodes:\n{console[-3000:]}")
    return {"nodes": nodes, "connections": int(found[2]), "reached": int(found[3]),
            "ms": int(found[4])}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--weft", default=os.path.join(ROOT, "target/release/weft"))
    parser.add_argument("--nodes", default="3,4,8,32")
    parser.add_argument("--json", default=os.path.join(ROOT, ".cache/bench/discovery/result.json"))
    args = parser.parse_args()
    image = subprocess.run([os.path.join(ROOT, "harness/vm/build-image.sh")],
                           capture_output=True, text=True, check=True).stdout.strip()
    print(f"bench-discovery: guest image {image}", file=sys.stderr)
    work = os.path.join(ROOT, ".cache/bench/discovery/run")
    results = []
    for nodes in [int(n) for n in args.nodes.split(",")]:
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        results.append(measure(args.weft, nodes, work))
        print(f"bench-discovery: {nodes} nodes done", file=sys.stderr)
    print(f"{'nodes':>6}{'discovery connections':>23}{'nodes reached':>15}{'connect-all ms':>16}")
    for r in results:
        print(f"{r['nodes']:>6}{r['connections']:>23}{r['reached']:>15}{r['ms']:>16}")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as out:
        json.dump({"runs": results}, out, indent=2)
    print(f"bench-discovery: JSON in {args.json}")


if __name__ == "__main__":
    main()
