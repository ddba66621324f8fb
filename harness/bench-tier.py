#!/usr/bin/env python3
"""What a pool's write tier buys, side by side in one run (issue 37): one
`weft serve` and three pools of the same kind of file-backed capacity
device, `plain` (no tier), `tiered` (a tier on a file in /dev/shm: RAM
stands in for Optane in front of QLC) and `fast` (its device itself in
/dev/shm: what the tier device gives through weft without a capacity device
behind it). `weft bench` (the host, on this machine, over NVMe/TCP on
loopback) runs every load on every side, alternating per round, each
from an empty tier (the script waits for the last load's destage):

- 4 KiB random writes at QD1 (latency) and QD32 (IOPS), and at QD1 on the
  bare tier file itself (`weft bench` on the file: io_uring, no weft);
- 4 KiB random reads at QD1, alone and while a writer runs at a fixed rate
  (`--rate-iops`) on another volume of the same pool: p99 and p99.9;
- 128 KiB sequential writes at QD8 over four times the tier's size: the
  sustained throughput once the tier is full (a fresh volume each round).

Prints a table and writes JSON (default .cache/bench/tier/result.json).

Usage: harness/bench-tier.py [--weft target/release/weft] [--runtime 5s]
       [--rounds 3] [--json FILE]      (a benchmark: outside CI; --runtime 1s
       --rounds 1 --tier-mib 32 is the smoke)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import harness_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST_NQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000071e400"
SIDES = ["plain", "tiered", "fast"]
SHM = "/dev/shm"
WRITER_RATE_IOPS = 1000


class Node(harness_module.load("bench-encryption").Node):
    LABEL = "bench-tier"


def bench(node, target, rw, iodepth, bs, runtime, size, extra=()):
    """One `weft bench` run on `target` (a volume's name or a path)."""
    if target.startswith("/"):
        url = target
    else:
        url = f"nvme-tcp://{node.nvme}/nqn.2026-11.io.weft:vol:{target}"
    timing = ["--runtime", runtime] if runtime else []
    done = subprocess.run(
        [node.weft, "bench", "--target", url, "--hostnqn", HOST_NQN, "--rw", rw, "--bs", bs,
         "--iodepth", str(iodepth), "--size", size, "--json", *timing, *extra],
        capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench-tier: bench {target} {rw}: {done.stderr.strip()}")
    side = json.loads(done.stdout)["jobs"][0]["read" if "read" in rw else "write"]
    percentiles = side["lat_ns"]["percentile"]
    return {"iops": side["iops"], "mib_s": side["bw_bytes"] / (1 << 20),
            "mean_us": side["lat_ns"]["mean"] / 1000,
            "p99_us": percentiles.get("99.000000", 0) / 1000,
            "p99_9_us": percentiles.get("99.900000", 0) / 1000, "ios": side["total_ios"]}


def settle(node):
    """Waits until the tiered pool's tier holds nothing (each load starts
    from an empty tier: the previous one's destage does not run into it)."""
    deadline = time.time() + 300
    while True:
        pools = json.loads(node.cli("pool", "list", "-o", "json"))
        pools = pools.get("pools", pools) if isinstance(pools, dict) else pools
        tier = next(p for p in pools if p["name"] == "tiered")["write_tier"]
        if tier["used_bytes"] == 0:
            return
        if time.time() > deadline:
            sys.exit(f"bench-tier: the tier did not drain: {tier}")
        time.sleep(0.2)


def with_cpu(node, run):
    """`run()`'s figures with the weft process's CPU per I/O."""
    before = node.cpu_seconds()
    result = run()
    result["cpu_us_per_io"] = (node.cpu_seconds() - before) * 1e6 / max(result["ios"], 1)
    return result


def read_under_writer(node, side, runtime, size):
    """QD1 random reads of `side`-r while `side`-w takes writes at a fixed rate."""
    writer = {}

    def write():
        writer["result"] = bench(node, f"{side}-w", "randwrite", 1, "4k", runtime, size,
                                 ["--rate-iops", str(WRITER_RATE_IOPS)])

    thread = threading.Thread(target=write)
    thread.start()
    result = bench(node, f"{side}-r", "randread", 1, "4k", runtime, size)
    thread.join()
    result["writer_iops"] = writer["result"]["iops"]
    return result


def setup(node, tier_mib, volume_size):
    """The three pools, their volumes, the host; the read volumes filled."""
    capacity = f"{4 * tier_mib + 1024}MiB"
    node.cli("pool", "create", "plain", "--device", os.path.join(node.dir, "plain.img"),
             "--device-size", capacity)
    node.cli("pool", "create", "tiered", "--device", os.path.join(node.dir, "tiered.img"),
             "--device-size", capacity, "--write-tier", f"{SHM}/weft-bench-tier.img",
             "--write-tier-size", f"{tier_mib}MiB")
    node.cli("pool", "create", "fast", "--device", f"{SHM}/weft-bench-fast.img",
             "--device-size", capacity)
    node.cli("host", "add", "bench", "--nqn", HOST_NQN)
    for side in SIDES:
        for role in ("w", "r"):
            name = f"{side}-{role}"
            node.cli("volume", "create", name, "--pool", side, "--size", volume_size)
            node.cli("volume", "attach", name, "--host", "bench")
        bench(node, f"{side}-r", "write", 8, "128k", None, volume_size)


def sustained(node, side, round_index, tier_mib):
    """128 KiB sequential writes over four times the tier, on a fresh volume."""
    name = f"{side}-s{round_index}"
    size = f"{4 * tier_mib}MiB"
    node.cli("volume", "create", name, "--pool", side, "--size", size)
    node.cli("volume", "attach", name, "--host", "bench")
    result = with_cpu(node, lambda: bench(node, name, "write", 8, "128k", None, size))
    node.cli("volume", "detach", name, "--host", "bench")
    node.cli("volume", "delete", name)
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--weft", default=os.path.join(ROOT, "target/release/weft"))
    parser.add_argument("--runtime", default="5s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tier-mib", type=int, default=256)
    parser.add_argument("--json", default=os.path.join(ROOT, ".cache/bench/tier/result.json"))
    args = parser.parse_args()
    for leftover in ("weft-bench-tier.img", "weft-bench-fast.img", "weft-bench-bare.img"):
        if os.path.exists(f"{SHM}/{leftover}"):
            os.remove(f"{SHM}/{leftover}")
    volume_size = "256MiB"
    bare = f"{SHM}/weft-bench-bare.img"
    with open(bare, "wb") as file:
        file.truncate(256 << 20)
    node = Node(args.weft, os.path.join(ROOT, ".cache/bench/tier/run"))
    rows = ["4k randwrite QD1", "4k randwrite QD32", "4k randread QD1 alone",
            f"4k randread QD1, writer {WRITER_RATE_IOPS}/s", "128k write QD8, 4x the tier"]
    runs = {row: {side: [] for side in SIDES + ["bare"]} for row in rows}
    try:
        setup(node, args.tier_mib, volume_size)
        for round_index in range(args.rounds):
            order = SIDES if round_index % 2 == 0 else SIDES[::-1]
            for side in order:
                w, r = f"{side}-w", f"{side}-r"
                settle(node)
                runs[rows[0]][side].append(with_cpu(node, lambda: bench(
                    node, w, "randwrite", 1, "4k", args.runtime, volume_size)))
                settle(node)
                runs[rows[1]][side].append(with_cpu(node, lambda: bench(
                    node, w, "randwrite", 32, "4k", args.runtime, volume_size)))
                settle(node)
                runs[rows[2]][side].append(bench(node, r, "randread", 1, "4k", args.runtime,
                                                 volume_size))
                settle(node)
                runs[rows[3]][side].append(read_under_writer(node, side, args.runtime,
                                                             volume_size))
                settle(node)
                runs[rows[4]][side].append(sustained(node, side, round_index, args.tier_mib))
            runs[rows[0]]["bare"].append(bench(node, bare, "randwrite", 1, "4k", args.runtime,
                                               volume_size))
    finally:
        node.stop()
        for image in ("weft-bench-tier.img", "weft-bench-fast.img", "weft-bench-bare.img"):
            if os.path.exists(f"{SHM}/{image}"):
                os.remove(f"{SHM}/{image}")
    summary = summarize(runs, rows)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as file:
        json.dump({"runtime": args.runtime, "rounds": args.rounds, "tier_mib": args.tier_mib,
                   "writer_rate_iops": WRITER_RATE_IOPS, "summary": summary, "runs": runs},
                  file, indent=1)
    print(f"(medians of {args.rounds} rounds of {args.runtime}; tier {args.tier_mib} MiB; "
          f"JSON: {args.json})")


def summarize(runs, rows):
    """Medians per row and side, printed as a table; the goals' ratios."""
    keys = ("iops", "mib_s", "mean_us", "p99_us", "p99_9_us", "cpu_us_per_io")
    summary = {}
    print(f"{'load':<32} {'side':<7} {'IOPS':>8} {'MiB/s':>7} {'mean us':>8} {'p99 us':>8} "
          f"{'p99.9 us':>9} {'cpu us/io':>9}")
    for row in rows:
        summary[row] = {}
        for side, results in runs[row].items():
            if not results:
                continue
            med = {k: statistics.median(r.get(k, 0) for r in results) for k in keys}
            summary[row][side] = med
            print(f"{row:<32} {side:<7} {med['iops']:>8.0f} {med['mib_s']:>7.0f} "
                  f"{med['mean_us']:>8.0f} {med['p99_us']:>8.0f} {med['p99_9_us']:>9.0f} "
                  f"{med['cpu_us_per_io']:>9.1f}")
    qd1 = summary[rows[0]]
    alone, under = summary[rows[2]], summary[rows[3]]
    goals = {
        "qd1_write_tiered_over_fast": qd1["tiered"]["mean_us"] / qd1["fast"]["mean_us"],
        "qd1_write_tiered_over_bare_file": qd1["tiered"]["mean_us"] / qd1["bare"]["mean_us"],
        "qd1_write_tiered_over_plain": qd1["tiered"]["mean_us"] / qd1["plain"]["mean_us"],
        "read_p99_under_writer_over_alone_tiered":
            under["tiered"]["p99_us"] / alone["tiered"]["p99_us"],
        "read_p99_under_writer_over_alone_plain":
            under["plain"]["p99_us"] / alone["plain"]["p99_us"],
    }
    for name, ratio in goals.items():
        print(f"{name}: {ratio:.2f}")
    summary["ratios"] = goals
    return summary


if __name__ == "__main__":
    main()
