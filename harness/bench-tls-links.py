#!/usr/bin/env python3
"""What TLS on replication links costs: two weft clusters on this machine, side
by side in one run, each etcd and three `weft serve` nodes on loopback:

  clear: etcd and the API in the clear (--insecure-store), links keyed by the
         cluster's token, in the clear;
  tls:   set up as the guide's cluster chapter (docs/guide/04-cluster.md) says (the cluster's CA, etcd
         over TLS with client certificates, `--pki` nodes): the links between
         nodes run in NVMe/TCP TLS 1.3 (AES-128-GCM), keyed per pair of nodes.

On each, a volume of one copy and one of three replicas, primary on n1, written
by `weft bench` (the host in the clear: only the links differ). Loads alternate
per round, and within a load the two clusters and the two volumes. Prints a
table (IOPS, mean and p99 latency, CPU of every process of the cluster per I/O;
TLS against clear) and writes JSON (default .cache/bench/tls-links/result.json).

Usage: harness/bench-tls-links.py [--weft target/release/weft] [--runtime 5s]
       [--rounds 3] [--json FILE]      (a benchmark: outside CI; --runtime 1s
       --rounds 1 is the smoke)
"""

import argparse
import json
import os
import shutil
import statistics
import sys

from harness_module import load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = 256 << 20
VOLUMES = ["single", "rep"]
CLUSTERS = ["clear", "tls"]
# (rw, queue depth, block size): writes, what crosses the links.
LOADS = [("randwrite", 1, "4k"), ("randwrite", 32, "4k"), ("write", 8, "128k")]


replication = load("bench-replication")
Cluster = load("bench-cluster").Cluster


def set_up(cluster):
    """Pools, the bench host, volumes single and rep (3 replicas) on n1, in
    sync, served, written once whole (thin volumes allocate on first write)."""
    cluster.start()
    n1 = cluster.nodes[0]
    cluster.create_pools(2 << 30)
    cluster.wait(lambda: all(len(n["pools"]) == 1 for n in cluster.must(n1, "GET", "nodes")),
                 "heartbeats with pools")
    cluster.must(n1, "POST", "hosts", {"name": "bench", "nqn": replication.HOST_NQN})
    cluster.must(n1, "POST", "volumes", {"name": "single", "size_bytes": SIZE, "node": "n1"})
    cluster.must(n1, "POST", "volumes", {"name": "rep", "size_bytes": SIZE, "node": "n1",
                                         "replicas": 3})
    for volume in VOLUMES:
        cluster.must(n1, "POST", f"volumes/{volume}/hosts", {"host": "bench"})
    cluster.wait(lambda: sum(r["state"] == "in-sync"
                             for r in replication.replicas(cluster, "rep")) == 3,
                 "rep's replicas in sync", limit=60)
    cluster.wait(lambda: replication.write_once(cluster, n1, "rep"), "rep served", limit=60)
    for volume in VOLUMES:
        replication.bench(cluster, volume, 32, "1s")


def label(load):
    rw, qd, bs = load
    return f"{bs} {rw} QD{qd}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--weft", default=os.path.join(ROOT, "target/release/weft"))
    parser.add_argument("--runtime", default="5s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=os.path.join(ROOT, ".cache/bench/tls-links/result.json"))
    args = parser.parse_args()
    work = os.path.join(ROOT, ".cache/bench/tls-links/run")
    shutil.rmtree(work, ignore_errors=True)
    clusters = {}
    try:
        for offset, name in enumerate(CLUSTERS):
            os.makedirs(os.path.join(work, name))
            clusters[name] = Cluster(args.weft, os.path.join(work, name), pki=name == "tls",
                                     port_offset=offset * 50)
            set_up(clusters[name])
        samples = {(c, v, load): [] for c in CLUSTERS for v in VOLUMES for load in LOADS}
        for _ in range(args.rounds):
            for load in LOADS:
                rw, qd, bs = load
                for name in CLUSTERS:
                    for volume in VOLUMES:
                        cluster = clusters[name]
                        before = replication.cpu_seconds(cluster)
                        iops, mean_us, p99_us, ios = replication.bench(
                            cluster, volume, qd, args.runtime, rw, bs)
                        spent = [b - a for a, b in zip(before, replication.cpu_seconds(cluster))]
                        samples[(name, volume, load)].append(
                            (iops, mean_us, p99_us, sum(spent) / max(ios, 1) * 1e6))
    finally:
        for cluster in clusters.values():
            cluster.stop()
    figures = {}
    for (name, volume, load), runs in samples.items():
        rw, qd, bs = load
        figures[f"{name}_{volume}_{rw}_{bs}_qd{qd}"] = {
            "iops": statistics.median(r[0] for r in runs),
            "mean_us": statistics.median(r[1] for r in runs),
            "p99_us": statistics.median(r[2] for r in runs),
            "cpu_us_per_io": statistics.median(r[3] for r in runs),
        }
    result = {"runtime": args.runtime, "rounds": args.rounds, "figures": figures}
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as out:
        json.dump(result, out, indent=2)
    print(f"{'3 replicas, links':<28} {'clear':>9} {'TLS':>9} {'TLS/clear':>10}"
          f"   {'1 copy (no link): clear':>24} {'TLS':>8}")
    for load in LOADS:
        rw, qd, bs = load
        rep = [figures[f"{c}_rep_{rw}_{bs}_qd{qd}"] for c in CLUSTERS]
        one = [figures[f"{c}_single_{rw}_{bs}_qd{qd}"] for c in CLUSTERS]
        for key, unit, fmt in [("iops", "IOPS", ".0f"), ("mean_us", "mean us", ".0f"),
                               ("p99_us", "p99 us", ".0f"), ("cpu_us_per_io", "CPU us/IO", ".1f")]:
            ratio = rep[1][key] / rep[0][key] if rep[0][key] else float("nan")
            print(f"{label(load) + ' ' + unit:<28} {rep[0][key]:>9{fmt}} {rep[1][key]:>9{fmt}}"
                  f" {ratio:>9.2f}x   {one[0][key]:>24{fmt}} {one[1][key]:>8{fmt}}")
    print(f"bench-tls-links: JSON in {args.json}")


if __name__ == "__main__":
    sys.exit(main())
