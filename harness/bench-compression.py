#!/usr/bin/env python3
"""What compression saves and costs, side by side in one run (issue 37): one
`weft serve`, one file-backed pool, and three thin volumes in it, `plain`,
`lz4` and `zstd` (`--compression`). Debian's fio with weft's I/O engine
(target/release/libweft_fio.so: the host, on this machine, over NVMe/TCP on
loopback) writes data that is 0%, 50% and 90% compressible (fio's
`buffer_compress_percentage`, new buffers for every write). For each
compressibility, on each volume, alternating per round:

- 128 KiB sequential writes at QD8 over the whole volume: MiB/s, then the
  ratio the volume reports (`weft volume show`: written / stored), and the
  CPU the weft process spent per MiB written;
- 4 KiB random writes at QD32 for the run time: IOPS and the CPU per I/O
  (the issue's goal: lz4 costs at most 10% of the plain volume's IOPS on
  incompressible data).

And the same three volumes in a second pool with a write tier (a file in
/dev/shm, `--tier-mib`, standing in for a fast device), where writes are
acknowledged from the tier and compressed when destaged: 4 KiB random
writes at QD32 for the run time from an empty tier, then the time the
tier takes to drain (its destage: compression's cost moved off the write)
and the ratio once drained.

Prints a table and writes JSON (default .cache/bench/compression/result.json).

Usage: harness/bench-compression.py [--weft target/release/weft]
       [--engine target/release/libweft_fio.so] [--runtime 5s] [--rounds 3]
       [--size-mib 256] [--tier-mib 1024] [--json FILE]      (a benchmark:
       outside CI; --runtime 1s --rounds 1 --size-mib 32 --tier-mib 64 is
       the smoke)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import harness_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST_NQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000c0a9e"
VOLUMES = ["plain", "lz4", "zstd"]
COMPRESSIBLE = [0, 50, 90]
TIER_IMAGE = "/dev/shm/weft-bench-compression-tier.img"
settle = harness_module.load("bench-tier").settle


class Node(harness_module.load("bench-encryption").Node):
    LABEL = "bench-compression"


def fio(node, engine, volume, rw, bs, iodepth, size_mib, percent, runtime):
    """One fio run: its write side's figures."""
    target = f"nvme-tcp\\://{node.nvme.replace(':', chr(92) + ':')}/nqn.2026-11.io.weft\\:vol\\:{volume}"
    timing = ["--time_based", f"--runtime={runtime}"] if runtime else []
    command = ["fio", f"--ioengine=external:{engine}", f"--filename={target}", "--name=c",
               f"--rw={rw}", f"--bs={bs}", f"--iodepth={iodepth}", f"--size={size_mib}m",
               f"--buffer_compress_percentage={percent}", "--buffer_compress_chunk=4096",
               "--refill_buffers", "--randrepeat=0", "--output-format=json", *timing]
    done = subprocess.run(command, capture_output=True, text=True,
                          env=dict(os.environ, WEFT_HOSTNQN=HOST_NQN))
    if done.returncode != 0:
        sys.exit(f"bench-compression: fio {rw} on {volume}: {done.stderr.strip()}"
                 f" {done.stdout[-500:]}")
    side = json.loads(done.stdout)["jobs"][0]["write"]
    return {"iops": side["iops"], "mib_s": side["bw_bytes"] / (1 << 20),
            "ios": side["total_ios"], "bytes": side["io_bytes"]}


def setup(node, size_mib, tier_mib):
    """The two pools (`bench`, and `tiered` with its write tier), the three
    volumes in each (`t-` before the tiered pool's), the host."""
    capacity = f"{4 * size_mib + 512}MiB"
    node.cli("pool", "create", "bench", "--device", os.path.join(node.dir, "pool.img"),
             "--device-size", capacity)
    # Room is kept for a whole 64 KiB unit per write waiting in the tier (bounded by the
    # tier's blocks): 16 times the tier, so that the runs measure the tier, not settles.
    node.cli("pool", "create", "tiered", "--device", os.path.join(node.dir, "tiered.img"),
             "--device-size", f"{16 * tier_mib + 4 * size_mib + 512}MiB",
             "--write-tier", TIER_IMAGE,
             "--write-tier-size", f"{tier_mib}MiB")
    node.cli("host", "add", "bench", "--nqn", HOST_NQN)
    for pool, prefix in (("bench", ""), ("tiered", "t-")):
        for volume in VOLUMES:
            extra = [] if volume == "plain" else ["--compression", volume]
            node.cli("volume", "create", prefix + volume, "--pool", pool, "--size",
                     f"{size_mib}MiB", *extra)
            node.cli("volume", "attach", prefix + volume, "--host", "bench")


def through_tier(node, engine, volume, size_mib, percent, runtime):
    """4 KiB random writes at QD32 to the tiered pool's `volume` from an
    empty tier, then how long its destage takes and the ratio after it."""
    settle(node)
    before = node.cpu_seconds()
    rand = fio(node, engine, "t-" + volume, "randwrite", "4k", 32, size_mib, percent, runtime)
    cpu = node.cpu_seconds() - before
    started = time.time()
    settle(node)
    drained = time.time() - started
    return {"rand_iops": rand["iops"], "rand_cpu_us_per_io": cpu * 1e6 / max(rand["ios"], 1),
            "drain_s": drained, "ratio": ratio(node, "t-" + volume)}


def medians(by_volume, keys):
    """Each volume's medians of `keys` over its rounds, with its 4k IOPS
    over the plain volume's."""
    med = {v: {k: statistics.median(r[k] for r in by_volume[v]) for k in keys} for v in VOLUMES}
    for m in med.values():
        m["rand_iops_vs_plain"] = m["rand_iops"] / max(med["plain"]["rand_iops"], 1e-9)
    return med


def tier_table(tiered):
    """Prints the tiered pool's table: its medians, by compressibility."""
    keys = ["rand_iops", "rand_cpu_us_per_io", "drain_s", "ratio"]
    summary = {}
    print(f"\non a pool with a write tier ({'4k QD32, from an empty tier'}):")
    print(f"{'data':<16} {'volume':<6} {'4k QD32 IOPS':>12} {'/plain':>6} {'us CPU/io':>9} "
          f"{'drain s':>8} {'ratio':>6}")
    for percent in COMPRESSIBLE:
        med = medians(tiered[percent], keys)
        for volume in VOLUMES:
            m = med[volume]
            print(f"{str(percent) + '% compressible':<16} {volume:<6} {m['rand_iops']:>12.0f} "
                  f"{m['rand_iops_vs_plain']:>6.2f} {m['rand_cpu_us_per_io']:>9.1f} "
                  f"{m['drain_s']:>8.1f} {m['ratio']:>6.2f}")
        summary[f"{percent}%"] = med
    return summary


def ratio(node, volume):
    shown = json.loads(node.cli("volume", "show", volume, "-o", "json"))
    return (shown.get("compression") or {}).get("ratio", 1.0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--weft", default=os.path.join(ROOT, "target/release/weft"))
    parser.add_argument("--engine", default=os.path.join(ROOT, "target/release/libweft_fio.so"))
    parser.add_argument("--runtime", default="5s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--tier-mib", type=int, default=1024)
    parser.add_argument("--json", default=os.path.join(ROOT, ".cache/bench/compression/result.json"))
    args = parser.parse_args()
    engine = os.path.abspath(args.engine)
    node = Node(args.weft, os.path.join(ROOT, ".cache/bench/compression/run"))
    runs = {p: {v: [] for v in VOLUMES} for p in COMPRESSIBLE}
    tiered = {p: {v: [] for v in VOLUMES} for p in COMPRESSIBLE}
    try:
        setup(node, args.size_mib, args.tier_mib)
        for round_index in range(args.rounds):
            for percent in COMPRESSIBLE:
                order = VOLUMES if round_index % 2 == 0 else VOLUMES[::-1]
                for volume in order:
                    before = node.cpu_seconds()
                    seq = fio(node, engine, volume, "write", "128k", 8, args.size_mib, percent, None)
                    seq_cpu = node.cpu_seconds() - before
                    before = node.cpu_seconds()
                    rand = fio(node, engine, volume, "randwrite", "4k", 32, args.size_mib, percent,
                               args.runtime)
                    rand_cpu = node.cpu_seconds() - before
                    runs[percent][volume].append({
                        "seq_mib_s": seq["mib_s"],
                        "seq_cpu_ms_per_mib": seq_cpu * 1e3 / max(seq["bytes"] / (1 << 20), 1),
                        "ratio": ratio(node, volume),
                        "rand_iops": rand["iops"],
                        "rand_cpu_us_per_io": rand_cpu * 1e6 / max(rand["ios"], 1),
                    })
                for volume in order:
                    tiered[percent][volume].append(
                        through_tier(node, engine, volume, args.size_mib, percent, args.runtime))
    finally:
        node.stop()
        if os.path.exists(TIER_IMAGE):
            os.remove(TIER_IMAGE)
    keys = ["seq_mib_s", "seq_cpu_ms_per_mib", "ratio", "rand_iops", "rand_cpu_us_per_io"]
    summary = {}
    print(f"{'data':<16} {'volume':<6} {'ratio':>6} {'128k MiB/s':>10} {'ms CPU/MiB':>10} "
          f"{'4k QD32 IOPS':>12} {'/plain':>6} {'us CPU/io':>9}")
    for percent in COMPRESSIBLE:
        med = medians(runs[percent], keys)
        for volume in VOLUMES:
            m = med[volume]
            m["seq_vs_plain"] = m["seq_mib_s"] / max(med["plain"]["seq_mib_s"], 1e-9)
            print(f"{str(percent) + '% compressible':<16} {volume:<6} {m['ratio']:>6.2f} "
                  f"{m['seq_mib_s']:>10.0f} {m['seq_cpu_ms_per_mib']:>10.2f} "
                  f"{m['rand_iops']:>12.0f} {m['rand_iops_vs_plain']:>6.2f} "
                  f"{m['rand_cpu_us_per_io']:>9.1f}")
        summary[f"{percent}%"] = med
    tier_summary = tier_table(tiered)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as file:
        json.dump({"runtime": args.runtime, "rounds": args.rounds, "size_mib": args.size_mib,
                   "tier_mib": args.tier_mib, "summary": summary, "runs": runs,
                   "tiered_summary": tier_summary, "tiered_runs": tiered}, file, indent=1)
    print(f"(medians of {args.rounds} rounds; JSON: {args.json})")


if __name__ == "__main__":
    main()
