#!/usr/bin/env python3
"""What replication costs on this machine: etcd (one member) and three
`weft serve` nodes on loopback (harness/bench-cluster.py's cluster), a
volume of one copy, one of two replicas and one of three on node n1, side
by side in one run, loaded by `weft bench` (weft's initiator) as the same host:

  - 4k random writes at QD1 (mean and p99 latency: the replication adder)
    and QD32 (IOPS: the ratio of two and three copies to one; and the CPU
    time per write, every node's and etcd's, and the primary's alone, from
    /proc: the cost that stays when the nodes do not share 2 cores; it
    includes the cluster's background work and the bench's connection, a
    few percent at QD32),
    alternated per round;
    the same with 4k random reads (served by the primary's own copy);
  - a full rebuild: a third 1 GiB volume, written whole, whose replica on
    n3 "rebooted" (its write intent names another boot) is rebuilt at the
    node's default limit (bytes, seconds, rate), and the host's 4k random
    reads at QD1 on it meanwhile against the same reads before (mean, p99);
  - a planned move: `volume move-primary`, request to answer, in ms;
  - unplanned failovers: the primary's node killed (SIGKILL) N times, each
    time the pause until a write succeeds on the new primary (the host tries
    every node in turn, as multipath does), p50 and max; the node restarts
    and is rebuilt before the next.

Prints a table and writes JSON (default .cache/bench/replication/result.json).

Usage: harness/bench-replication.py [--weft target/release/weft] [--runtime 5s]
       [--rounds 3] [--failovers 20] [--lease-ms MS] [--rebuild-mib-s 256]
       [--read-runtime 2s] [--reactors 1] [--queues 1]
       [--replicated-queues follow|spread] [--json FILE]
       (a benchmark: outside CI; --runtime 1s --rounds 1 --failovers 1
       --read-runtime 500ms is the smoke)
"""

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST_NQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000bc1a5"
SIZE = 256 << 20
# One copy, two replicas, three replicas: side by side, alternated.
VOLUMES = ["single", "rep2", "rep"]
# (rw, queue depth, block size), alternated per round.
LOADS = [("randwrite", 1, "4k"), ("randwrite", 32, "4k"), ("write", 8, "128k"),
         ("randread", 1, "4k"), ("randread", 32, "4k")]


def figure_name(volume, load):
    """The JSON key of `volume`'s figures under `load` (4k names as before)."""
    rw, qd, bs = load
    if bs != "4k":
        return f"{volume}_{rw}_{bs}_qd{qd}"
    return f"{volume}_qd{qd}" + ("" if rw == "randwrite" else "_read")


def load_cluster():
    spec = importlib.util.spec_from_file_location(
        "bench_cluster", os.path.join(ROOT, "harness", "bench-cluster.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Cluster


# I/O queues of each `weft bench` (--queues), each at the load's I/O depth.
QUEUES = 1


def bench(cluster, volume, iodepth, runtime, rw="randwrite", bs="4k", size="64MiB"):
    """`weft bench` `bs` `rw` on `volume` (on n1) over its first `size`
    (one pass if `runtime` is None): (iops, mean us, p99 us, I/Os done)."""
    url = f"nvme-tcp://{cluster.nodes[0]['nvme']}/nqn.2026-11.io.weft:vol:{volume}"
    timing = ["--runtime", runtime] if runtime else []
    for attempt in range(3):
        done = subprocess.run(
            [cluster.weft, "bench", "--target", url, "--hostnqn", HOST_NQN, "--rw", rw,
             "--bs", bs, "--iodepth", str(iodepth), "--size", size, "--json",
             "--queues", str(QUEUES)] + timing,
            capture_output=True, text=True)
        if done.returncode == 0:
            break
        what = f"bench {volume} {rw} QD{iodepth}: {done.stderr.strip()}"
        show_logs(cluster, volume)
        # `weft bench` is a host with one path: an ANA status means the
        # volume failed over meanwhile (a kernel host would have waited
        # for a path); said, the primary brought back to n1, run again.
        if "status ANA_" not in done.stderr or attempt == 2:
            sys.exit(f"bench-replication: {what}")
        print(f"bench-replication: {what}; the run again once n1 serves it", file=sys.stderr)
        serve_on_n1(cluster, volume)
    side = json.loads(done.stdout)["jobs"][0]["read" if "read" in rw else "write"]
    percentiles = side["lat_ns"]["percentile"]
    p99 = percentiles.get("99.000000", max(percentiles.values(), default=0))
    return side["iops"], side["lat_ns"]["mean"] / 1000, p99 / 1000, side["total_ios"]


def cpu_seconds(cluster):
    """CPU time (user and system) each of the cluster's processes used so
    far, in its order (etcd first, then n1, n2, n3; 0 for one not running)."""
    hz = os.sysconf("SC_CLK_TCK")
    spent = []
    for process in cluster.processes:
        try:
            stat = open(f"/proc/{process.pid}/stat").read()
            fields = stat[stat.rindex(")") + 2:].split()
            spent.append((int(fields[11]) + int(fields[12])) / hz)
        except (OSError, ValueError):
            spent.append(0.0)
    return spent


def show_logs(cluster, volume):
    """What the nodes logged about `volume` and their leases (the last lines)."""
    for node in cluster.nodes:
        try:
            lines = open(os.path.join(cluster.work, f"{node['name']}.log")).read().splitlines()
        except OSError:
            continue
        wanted = [l for l in lines if f"volume {volume}:" in l or "WARN" in l or "ERROR" in l]
        for line in wanted[-15:]:
            print(f"  {node['name']}: {line}", file=sys.stderr)


def serve_on_n1(cluster, volume):
    """Waits until `volume` is in sync, moves its primary back to n1 if
    another node took it, and waits until n1 acknowledges a write."""
    n1 = cluster.nodes[0]
    copies = len(replicas(cluster, volume))
    cluster.wait(lambda: sum(r["state"] == "in-sync" for r in replicas(cluster, volume)) == copies,
                 f"{volume} in sync again", limit=120)
    if copies and not any(r["role"] == "primary" and r["node"] == "n1"
                          for r in replicas(cluster, volume)):
        cluster.must(n1, "POST", f"volumes/{volume}/move-primary", {"to": "n1"})
    cluster.wait(lambda: write_once(cluster, n1, volume), f"{volume} served by n1 again", limit=60)


def replicas(cluster, volume, via=None):
    """`volume`'s replicas as `volume show` through `via` (n1 by default) lists them."""
    code, answer = cluster.call(via or cluster.nodes[0], "GET", f"volumes/{volume}")
    return (answer.get("replicas") or []) if code == 200 else []


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--weft", default=os.path.join(ROOT, "target/release/weft"))
    parser.add_argument("--runtime", default="5s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--failovers", type=int, default=20)
    parser.add_argument("--read-runtime", default="2s",
                        help="host reads before and during the rebuild, each")
    parser.add_argument("--lease-ms", type=int, help="the nodes' lease_ttl_ms (default weft's)")
    parser.add_argument("--rebuild-mib-s", type=int, default=256,
                        help="the nodes' rebuild_mib_per_s (weft's default 256)")
    parser.add_argument("--reactors", type=int, default=1, help="each node's reactors")
    parser.add_argument("--queues", type=int, default=1,
                        help="I/O queues of the host, each at the load's I/O depth")
    parser.add_argument("--replicated-queues", choices=["follow", "spread"],
                        help="the nodes' placement of replicated volumes' queues (default weft's)")
    parser.add_argument("--json", default=os.path.join(ROOT, ".cache/bench/replication/result.json"))
    args = parser.parse_args()
    global QUEUES
    QUEUES = args.queues
    work = os.path.join(ROOT, ".cache/bench/replication/run")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    lease = f"lease_ttl_ms = {args.lease_ms}\n" if args.lease_ms else ""
    limit = f"rebuild_mib_per_s = {args.rebuild_mib_s}\n"
    serve_args = (["--replicated-queues", args.replicated_queues]
                  if args.replicated_queues else [])
    cluster = load_cluster()(args.weft, work, lease + limit, args.reactors, serve_args)
    try:
        cluster.start()
        n1 = cluster.nodes[0]
        cluster.create_pools(2 << 30)
        cluster.wait(lambda: all(len(n["pools"]) == 1 for n in cluster.must(n1, "GET", "nodes")),
                     "heartbeats with pools")
        cluster.must(n1, "POST", "hosts", {"name": "bench", "nqn": HOST_NQN})
        cluster.must(n1, "POST", "volumes", {"name": "single", "size_bytes": SIZE, "node": "n1"})
        for name, copies in [("rep2", 2), ("rep", 3)]:
            cluster.must(n1, "POST", "volumes", {"name": name, "size_bytes": SIZE, "node": "n1",
                                                 "replicas": copies})
        for volume in VOLUMES:
            cluster.must(n1, "POST", f"volumes/{volume}/hosts", {"host": "bench"})
        for name, copies in [("rep2", 2), ("rep", 3)]:
            cluster.wait(lambda: sum(r["state"] == "in-sync"
                                     for r in replicas(cluster, name)) == copies,
                         f"{name}'s replicas in sync")
            cluster.wait(lambda: write_once(cluster, n1, name), f"{name} served")
        # Written once whole (thin volumes allocate on first write).
        for volume in VOLUMES:
            bench(cluster, volume, 32, "1s")
        samples = {(v, load): [] for v in VOLUMES for load in LOADS}
        for _ in range(args.rounds):
            for load in LOADS:
                rw, qd, bs = load
                for volume in VOLUMES:
                    before = cpu_seconds(cluster)
                    run = bench(cluster, volume, qd, args.runtime, rw, bs)
                    spent = [b - a for a, b in zip(before, cpu_seconds(cluster))]
                    ios = max(run[3], 1)
                    samples[(volume, load)].append(
                        run + (sum(spent) / ios * 1e6, spent[1] / ios * 1e6))
        figures = {}
        for (volume, load), runs in samples.items():
            figures[figure_name(volume, load)] = {
                "iops": statistics.median(r[0] for r in runs),
                "mean_us": statistics.median(r[1] for r in runs),
                "p99_us": statistics.median(r[2] for r in runs),
                "cpu_us_per_io": statistics.median(r[4] for r in runs),
                "primary_cpu_us_per_io": statistics.median(r[5] for r in runs),
            }
        rebuild = measure_rebuild(cluster, work, args.read_runtime, args.rebuild_mib_s)
        move_ms = measure_move(cluster)
        pauses = [measure_failover(cluster, work) for _ in range(args.failovers)]
    finally:
        cluster.stop()
    result = {
        "runtime": args.runtime, "rounds": args.rounds, "figures": figures,
        "qd1_write_adder_us": figures["rep_qd1"]["mean_us"] - figures["single_qd1"]["mean_us"],
        "qd32_write_ratio": figures["rep_qd32"]["iops"] / figures["single_qd32"]["iops"],
        "qd32_read_ratio": figures["rep_qd32_read"]["iops"] / figures["single_qd32_read"]["iops"],
        "qd1_write_adder_us_2": figures["rep2_qd1"]["mean_us"] - figures["single_qd1"]["mean_us"],
        "qd32_write_ratio_2": figures["rep2_qd32"]["iops"] / figures["single_qd32"]["iops"],
        "rebuild": rebuild, "move_primary_ms": move_ms,
        "lease_ttl_ms": args.lease_ms or 3000, "failover_pauses_s": pauses,
    }
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as out:
        json.dump(result, out, indent=2)
    for rw, suffix in [("randwrite", ""), ("randread", "_read")]:
        print(f"{'4k ' + rw:<24} {'1 copy':>10} {'2 replicas':>11} {'3 replicas':>11}"
              f" {'2 / 1':>8} {'3 / 1':>8}")
        for qd in [1, 32]:
            one, two, three = (figures[f"{v}_qd{qd}{suffix}"] for v in VOLUMES)
            print(f"{f'QD{qd} IOPS':<24} {one['iops']:>10.0f} {two['iops']:>11.0f}"
                  f" {three['iops']:>11.0f} {two['iops'] / one['iops']:>7.2f}x"
                  f" {three['iops'] / one['iops']:>7.2f}x")
            for key, label in [("mean_us", "mean"), ("p99_us", "p99")]:
                print(f"{f'QD{qd} {label} latency (us)':<24} {one[key]:>10.0f} {two[key]:>11.0f}"
                      f" {three[key]:>11.0f} {two[key] - one[key]:>+8.0f}"
                      f" {three[key] - one[key]:>+8.0f}")
            for key, label in [("cpu_us_per_io", "CPU"), ("primary_cpu_us_per_io", "n1 CPU")]:
                base = one[key] or float("nan")
                print(f"{f'QD{qd} {label} per I/O (us)':<24} {one[key]:>10.1f} {two[key]:>11.1f}"
                      f" {three[key]:>11.1f} {two[key] / base:>7.2f}x"
                      f" {three[key] / base:>7.2f}x")
    print(f"{'128k write QD8':<24} {'1 copy':>10} {'2 replicas':>11} {'3 replicas':>11}"
          f" {'2 / 1':>8} {'3 / 1':>8}")
    one, two, three = (figures[figure_name(v, ("write", 8, "128k"))] for v in VOLUMES)
    mib = lambda f: f["iops"] / 8
    print(f"{'MiB/s':<24} {mib(one):>10.0f} {mib(two):>11.0f} {mib(three):>11.0f}"
          f" {mib(two) / mib(one):>7.2f}x {mib(three) / mib(one):>7.2f}x")
    for key, label in [("cpu_us_per_io", "CPU"), ("primary_cpu_us_per_io", "n1 CPU")]:
        base = one[key] or float("nan")
        print(f"{f'{label} per 128k write (us)':<24} {one[key]:>10.1f} {two[key]:>11.1f}"
              f" {three[key]:>11.1f} {two[key] / base:>7.2f}x {three[key] / base:>7.2f}x")
    print(f"full rebuild of a {rebuild['bytes'] >> 20} MiB replica: {rebuild['seconds']:.1f} s,"
          f" {rebuild['rate_mib_s']:.0f} MiB/s (limit {rebuild['limit_mib_s']} MiB/s)")
    quiet, busy = rebuild["reads_before"], rebuild["reads_during"]
    print(f"4k randread QD1 on it, before / during the rebuild: mean {quiet['mean_us']:.0f} /"
          f" {busy['mean_us']:.0f} us, p99 {quiet['p99_us']:.0f} / {busy['p99_us']:.0f} us"
          f" ({busy['p99_us'] / quiet['p99_us']:.2f}x)")
    print(f"planned move (move-primary, request to answer): {move_ms:.0f} ms")
    if pauses:
        print(f"unplanned failover, kill to the first write on the new primary, lease"
              f" {result['lease_ttl_ms']} ms, {len(pauses)} kills: p50"
              f" {statistics.median(pauses):.1f} s, max {max(pauses):.1f} s")
    print(f"(JSON: {args.json})")


def measure_rebuild(cluster, work, read_runtime, limit_mib_s):
    """Volume `big` (1 GiB, three replicas) written whole; n3 stops, its
    replica's intent is made to name another boot (a power loss), n3 starts
    again: the time until it is in sync once more, and the host's reads on
    `big` before and while it is rebuilt."""
    n1, n3 = cluster.nodes[0], cluster.nodes[2]
    size = 1 << 30
    cluster.must(n1, "POST", "volumes", {"name": "big", "size_bytes": size, "node": "n1",
                                         "replicas": 3})
    cluster.must(n1, "POST", "volumes/big/hosts", {"host": "bench"})
    cluster.wait(lambda: sum(r["state"] == "in-sync" for r in replicas(cluster, "big")) == 3,
                 "big in sync")
    # Its primary serves a moment after the record says so (ANA Transition before).
    cluster.wait(lambda: write_once(cluster, n1, "big"), "big served")
    bench(cluster, "big", 8, None, rw="write", bs="128k", size="1GiB")
    before = bench(cluster, "big", 1, read_runtime, rw="randread", size="1GiB")
    process = cluster.processes[n3["process"]]
    process.kill()
    process.wait()
    intent = os.path.join(work, "n3", "replicas", "big.intent")
    lines = open(intent).read().split("\n", 1)
    with open(intent, "w") as out:
        out.write("boot another-boot\n" + lines[1])
    log = open(os.path.join(work, "n3.log"), "a")
    cluster.wait(lambda: cluster.must(n1, "GET", "nodes/n3")["state"] == "down", "n3 shown down")
    cluster.processes[n3["process"]] = subprocess.Popen(
        n3["args"], stdout=subprocess.DEVNULL, stderr=log)
    cluster.wait(lambda: cluster.call(n3, "GET", "stats")[0] == 200, "n3 again")
    # The primary notices at its next write to n3: one write starts it.
    bench(cluster, "big", 1, "200ms", size="1GiB")
    start = time.perf_counter()
    during = bench(cluster, "big", 1, read_runtime, rw="randread", size="1GiB")
    rebuilding = any(r["state"] == "rebuilding" for r in replicas(cluster, "big"))
    cluster.wait(lambda: sum(r["state"] == "in-sync" for r in replicas(cluster, "big")) == 3,
                 "n3 rebuilt", limit=600)
    seconds = time.perf_counter() - start
    reads = lambda r: {"iops": r[0], "mean_us": r[1], "p99_us": r[2]}
    return {"bytes": size, "seconds": seconds, "rate_mib_s": (size >> 20) / seconds,
            "limit_mib_s": limit_mib_s, "reads_before": reads(before), "reads_during": reads(during),
            "rebuilding_to_the_end": rebuilding}


def primary_of(cluster, via):
    return next((r["node"] for r in replicas(cluster, "rep", via) if r["role"] == "primary"), None)


def write_once(cluster, node, volume="rep"):
    """One 4k write to `volume` through `node`: whether it was acknowledged."""
    url = f"nvme-tcp://{node['nvme']}/nqn.2026-11.io.weft:vol:{volume}"
    done = subprocess.run(
        [cluster.weft, "bench", "--target", url, "--hostnqn", HOST_NQN, "--rw", "randwrite",
         "--bs", "4k", "--iodepth", "1", "--runtime", "20ms", "--size", "1MiB", "--json"],
        capture_output=True, text=True)
    return done.returncode == 0


def measure_failover(cluster, work):
    """Kills the primary's node; seconds until a write is acknowledged
    again (through whichever node serves); then restarts the node and waits
    until every replica is in sync."""
    n1 = next(n for n in cluster.nodes if cluster.call(n, "GET", "stats")[0] == 200)
    name = primary_of(cluster, n1)
    victim = next(n for n in cluster.nodes if n["name"] == name)
    others = [n for n in cluster.nodes if n is not victim]
    process = cluster.processes[victim["process"]]
    process.kill()
    killed = time.perf_counter()
    process.wait()
    deadline = killed + 60
    while time.perf_counter() < deadline:
        if any(write_once(cluster, node) for node in others):
            break
        time.sleep(0.02)
    else:
        sys.exit(f"bench-replication: no write acknowledged within 60 s of killing {name}")
    pause = time.perf_counter() - killed
    log = open(os.path.join(work, f"{name}.log"), "a")
    cluster.processes[victim["process"]] = subprocess.Popen(
        victim["args"], stdout=subprocess.DEVNULL, stderr=log)
    cluster.wait(lambda: cluster.call(victim, "GET", "stats")[0] == 200, f"{name} again")
    cluster.wait(lambda: sum(r["state"] == "in-sync" for r in replicas(cluster, "rep", others[0])) == 3,
                 f"{name} rebuilt", limit=120)
    return pause


def measure_move(cluster):
    start = time.perf_counter()
    cluster.must(cluster.nodes[0], "POST", "volumes/rep/move-primary", {"to": "n2"})
    return (time.perf_counter() - start) * 1000


if __name__ == "__main__":
    main()
