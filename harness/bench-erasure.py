#!/usr/bin/env python3
"""What erasure coding costs and saves, side by side in one run: etcd and three
`weft serve` nodes on loopback, and three volumes with their primary on n1:

  single: one copy (on n1);
  rep:    three replicas (n1, n2, n3);
  ec:     erasure-coded 2+1 (a shard on each of n1, n2, n3: two data chunks and
          one parity chunk per stripe).

Each written by `weft bench` (the host, on this machine) through n1, loads
alternating per round and within a load the volumes: 4 KiB random writes at
QD1 and QD32, 128 KiB sequential writes at QD8, 4 KiB random reads at QD1 and
QD32, with the CPU of every process of the cluster (etcd and the three nodes)
per I/O and per written byte. Then n3 is killed: reads of ec are rebuilt from
the two other members (degraded reads, at QD1 and QD32); the whole of ec is
written meanwhile, n3 restarts and the time until its member is rebuilt gives
the rebuild's throughput. Raw capacity per usable byte comes from `volume
show`. Prints a table and writes JSON (default .cache/bench/erasure/result.json).

Usage: harness/bench-erasure.py [--weft target/release/weft] [--runtime 5s]
       [--rounds 3] [--json FILE]      (a benchmark: outside CI; --runtime 1s
       --rounds 1 is the smoke)
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

from harness_module import load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = 256 << 20
VOLUMES = ["single", "rep", "ec"]
LOADS = [("randwrite", 1, "4k"), ("randwrite", 32, "4k"), ("write", 8, "128k"),
         ("randread", 1, "4k"), ("randread", 32, "4k")]
DEGRADED = [("randread", 1, "4k"), ("randread", 32, "4k")]


replication = load("bench-replication")
Cluster = load("bench-cluster").Cluster


def set_up(cluster):
    """Pools, the bench host, the three volumes on n1 (members in sync,
    served), each written once whole (thin volumes allocate on first write)."""
    cluster.start()
    n1 = cluster.nodes[0]
    cluster.create_pools(2 << 30)
    cluster.wait(lambda: all(len(n["pools"]) == 1 for n in cluster.must(n1, "GET", "nodes")),
                 "heartbeats with pools")
    cluster.must(n1, "POST", "hosts", {"name": "bench", "nqn": replication.HOST_NQN})
    cluster.must(n1, "POST", "volumes", {"name": "single", "size_bytes": SIZE, "node": "n1"})
    cluster.must(n1, "POST", "volumes", {"name": "rep", "size_bytes": SIZE, "node": "n1",
                                         "replicas": 3})
    cluster.must(n1, "POST", "volumes", {"name": "ec", "size_bytes": SIZE, "node": "n1",
                                         "ec": "2+1"})
    for volume in VOLUMES:
        cluster.must(n1, "POST", f"volumes/{volume}/hosts", {"host": "bench"})
    for volume in ["rep", "ec"]:
        cluster.wait(lambda: in_sync(cluster, volume) == 3, f"{volume}'s members in sync",
                     limit=60)
        cluster.wait(lambda: replication.write_once(cluster, n1, volume), f"{volume} served",
                     limit=60)
    for volume in VOLUMES:
        replication.bench(cluster, volume, 8, None, "write", "128k", f"{SIZE >> 20}MiB")


def in_sync(cluster, volume):
    return sum(r["state"] == "in-sync" for r in replication.replicas(cluster, volume))


def measure(cluster, volume, load, runtime):
    """(iops, mean us, p99 us, CPU us of the whole cluster per I/O)."""
    rw, qd, bs = load
    before = replication.cpu_seconds(cluster)
    iops, mean_us, p99_us, ios = replication.bench(cluster, volume, qd, runtime, rw, bs)
    spent = [b - a for a, b in zip(before, replication.cpu_seconds(cluster))]
    return iops, mean_us, p99_us, sum(spent) / max(ios, 1) * 1e6


def kill(cluster, node):
    process = cluster.processes[node["process"]]
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)


def start_again(cluster, node):
    log = open(os.path.join(cluster.work, f"{node['name']}.log"), "a")
    cluster.processes[node["process"]] = subprocess.Popen(
        node["args"], stdout=subprocess.DEVNULL, stderr=log)
    node["pid"] = cluster.processes[node["process"]].pid
    cluster.wait(lambda: cluster.call(node, "GET", "stats")[0] == 200, node["name"])


def label(load):
    rw, qd, bs = load
    return f"{bs} {rw} QD{qd}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--weft", default=os.path.join(ROOT, "target/release/weft"))
    parser.add_argument("--runtime", default="5s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=os.path.join(ROOT, ".cache/bench/erasure/result.json"))
    args = parser.parse_args()
    work = os.path.join(ROOT, ".cache/bench/erasure/run")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    # The rebuild as fast as it goes (the default limit is 256 MiB/s).
    cluster = Cluster(args.weft, work, cluster_toml="rebuild_mib_per_s = 4096")
    figures, degraded, rebuild = {}, {}, {}
    try:
        set_up(cluster)
        n1, n3 = cluster.nodes[0], cluster.nodes[2]
        raw = {}
        for volume in VOLUMES:
            shown = cluster.must(n1, "GET", f"volumes/{volume}")
            raw[volume] = (shown["erasure"]["raw_bytes"] / SIZE if shown.get("erasure")
                           else len(shown.get("replicas") or [None]))
        samples = {(v, load): [] for v in VOLUMES for load in LOADS}
        for _ in range(args.rounds):
            for load in LOADS:
                for volume in VOLUMES:
                    samples[(volume, load)].append(measure(cluster, volume, load, args.runtime))
        for (volume, load), runs in samples.items():
            figures[f"{volume}_{label(load).replace(' ', '_')}"] = {
                "iops": statistics.median(r[0] for r in runs),
                "mean_us": statistics.median(r[1] for r in runs),
                "p99_us": statistics.median(r[2] for r in runs),
                "cpu_us_per_io": statistics.median(r[3] for r in runs),
            }
        # A member down: reads of its chunks are rebuilt from the others.
        kill(cluster, n3)
        # Writes find it gone (an idle primary does not notice).
        for volume in ["rep", "ec"]:
            replication.bench(cluster, volume, 4, "1s", "randwrite", "4k")
        cluster.wait(lambda: in_sync(cluster, "ec") == 2 and in_sync(cluster, "rep") == 2,
                     "n3's members faulted", limit=60)
        for load in DEGRADED:
            for volume in ["rep", "ec"]:
                runs = [measure(cluster, volume, load, args.runtime) for _ in range(args.rounds)]
                degraded[f"{volume}_{label(load).replace(' ', '_')}"] = {
                    "iops": statistics.median(r[0] for r in runs),
                    "mean_us": statistics.median(r[1] for r in runs),
                    "p99_us": statistics.median(r[2] for r in runs),
                }
        # Every stripe written while n3 is away: its member is rebuilt whole.
        replication.bench(cluster, "ec", 8, None, "write", "128k", f"{SIZE >> 20}MiB")
        start_again(cluster, n3)
        began = time.monotonic()
        cluster.wait(lambda: in_sync(cluster, "ec") == 3, "ec's member on n3 rebuilt", limit=600)
        took = time.monotonic() - began
        shard = SIZE // 2
        rebuild = {"shard_bytes": shard, "seconds": took, "mib_per_s": shard / took / (1 << 20)}
        cluster.wait(lambda: in_sync(cluster, "rep") == 3, "rep's replica on n3 rebuilt",
                     limit=600)
    finally:
        cluster.stop()
    result = {"runtime": args.runtime, "rounds": args.rounds, "volume_bytes": SIZE,
              "raw_per_usable": raw, "figures": figures, "degraded": degraded,
              "rebuild": rebuild}
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as out:
        json.dump(result, out, indent=2)
    print(f"{'':<30} {'1 copy':>10} {'3 replicas':>11} {'ec 2+1':>10} {'ec/replicas':>12}")
    print(f"{'raw bytes per usable byte':<30} {raw['single']:>10.2f} {raw['rep']:>11.2f}"
          f" {raw['ec']:>10.2f} {raw['ec'] / raw['rep']:>11.2f}x")
    for load in LOADS:
        key = label(load).replace(" ", "_")
        for field, unit, fmt in [("iops", "IOPS", ".0f"), ("mean_us", "mean us", ".0f"),
                                 ("p99_us", "p99 us", ".0f"), ("cpu_us_per_io", "CPU us/IO", ".1f")]:
            one, rep, ec = (figures[f"{v}_{key}"][field] for v in VOLUMES)
            ratio = ec / rep if rep else float("nan")
            print(f"{label(load) + ' ' + unit:<30} {one:>10{fmt}} {rep:>11{fmt}} {ec:>10{fmt}}"
                  f" {ratio:>11.2f}x")
    write = figures["ec_128k_write_QD8"]
    for volume in VOLUMES:
        per_byte = figures[f"{volume}_128k_write_QD8"]["cpu_us_per_io"] / 128
        print(f"CPU per written KiB, 128k writes, {volume}: {per_byte:.2f} us")
    for load in DEGRADED:
        key = label(load).replace(" ", "_")
        rep, ec = degraded[f"rep_{key}"], degraded[f"ec_{key}"]
        print(f"{'n3 down: ' + label(load) + ' IOPS':<30} {'':>10} {rep['iops']:>11.0f}"
              f" {ec['iops']:>10.0f} {ec['iops'] / rep['iops']:>11.2f}x")
    print(f"rebuild of ec's member on n3 ({rebuild['shard_bytes'] >> 20} MiB): "
          f"{rebuild['seconds']:.1f} s, {rebuild['mib_per_s']:.0f} MiB/s"
          f" (128k writes to ec: {write['iops'] * 128 / 1024:.0f} MiB/s)")
    print(f"bench-erasure: JSON in {args.json}")


if __name__ == "__main__":
    sys.exit(main())
