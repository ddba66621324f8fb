#!/usr/bin/env python3
"""What encryption at rest costs, side by side in one run: one `weft serve`
with a key file, one pool, and two thin volumes in it, `plain` and `enc`
(`--encrypt`: AES-256-XTS), each written whole first (so both read data and
overwrite allocated units). `weft bench` (the host, on this machine, over
NVMe/TCP on loopback) runs each load on each volume, alternating per round:
4 KiB random writes and reads at QD32, 128 KiB sequential writes and reads
at QD8, and 4 KiB random writes at QD1 (latency). For each: IOPS or MiB/s,
mean and p99 latency, and the CPU the weft process spent per I/O, with the
enc/plain ratios. Prints a table and writes JSON (default
.cache/bench/encryption/result.json).

Usage: harness/bench-encryption.py [--weft target/release/weft] [--runtime 5s]
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST_NQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000e0c0b"
SIZE = "512MiB"
VOLUMES = ["plain", "enc"]
LOADS = [("randwrite", 32, "4k"), ("randread", 32, "4k"), ("write", 8, "128k"),
         ("read", 8, "128k"), ("randwrite", 1, "4k")]
KEY = "3f1e5d7c9b0a2f4e6d8c0b1a3f5e7d9c" * 2


class Node:
    """A `weft serve` on loopback ports, with a key file, in `directory`
    (`LABEL` names the script in its errors)."""

    LABEL = "bench-encryption"

    def __init__(self, weft, directory):
        self.weft, self.dir = weft, directory
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        key = os.path.join(directory, "kek")
        with open(key, "w") as file:
            file.write(KEY + "\n")
        os.chmod(key, 0o600)
        self.nvme, api = "127.0.0.1:14470", "127.0.0.1:14471"
        self.log = open(os.path.join(directory, "serve.log"), "w")
        self.process = subprocess.Popen(
            [weft, "serve", "--data-dir", os.path.join(directory, "data"), "--listen", self.nvme,
             "--api-listen", api, "--kek-file", key], stdout=self.log, stderr=self.log)
        token = os.path.join(directory, "data", "api-token")
        deadline = time.time() + 30
        while not os.path.exists(token) or not self.answers(api, token):
            if time.time() > deadline or self.process.poll() is not None:
                sys.exit(f"{self.LABEL}: weft serve did not start (see {directory}/serve.log)")
            time.sleep(0.1)
        self.env = dict(os.environ, WEFT_API=api, WEFT_API_TOKEN=open(token).read().strip())

    def answers(self, api, token):
        env = dict(os.environ, WEFT_API=api, WEFT_API_TOKEN=open(token).read().strip())
        return subprocess.run([self.weft, "pool", "list"], env=env,
                              capture_output=True).returncode == 0

    def cli(self, *args):
        done = subprocess.run([self.weft, *args], env=self.env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{self.LABEL}: weft {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def cpu_seconds(self):
        stat = open(f"/proc/{self.process.pid}/stat").read()
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def bench(self, volume, rw, iodepth, bs, runtime):
        url = f"nvme-tcp://{self.nvme}/nqn.2026-11.io.weft:vol:{volume}"
        timing = ["--runtime", runtime] if runtime else []
        done = subprocess.run(
            [self.weft, "bench", "--target", url, "--hostnqn", HOST_NQN, "--rw", rw, "--bs", bs,
             "--iodepth", str(iodepth), "--size", SIZE, "--json"] + timing,
            capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{self.LABEL}: bench {volume} {rw}: {done.stderr.strip()}")
        side = json.loads(done.stdout)["jobs"][0]["read" if "read" in rw else "write"]
        percentiles = side["lat_ns"]["percentile"]
        p99 = percentiles.get("99.000000", max(percentiles.values(), default=0))
        return {"iops": side["iops"], "mib_s": side["bw_bytes"] / (1 << 20),
                "mean_us": side["lat_ns"]["mean"] / 1000, "p99_us": p99 / 1000,
                "ios": side["total_ios"]}

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)


def figure(load):
    rw, iodepth, bs = load
    return f"{bs} {rw} QD{iodepth}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--weft", default=os.path.join(ROOT, "target/release/weft"))
    parser.add_argument("--runtime", default="5s")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=os.path.join(ROOT, ".cache/bench/encryption/result.json"))
    args = parser.parse_args()
    node = Node(args.weft, os.path.join(ROOT, ".cache/bench/encryption/run"))
    try:
        node.cli("pool", "create", "bench", "--device", os.path.join(node.dir, "pool.img"),
                 "--device-size", "2GiB")
        node.cli("host", "add", "bench", "--nqn", HOST_NQN)
        for volume in VOLUMES:
            extra = ["--encrypt"] if volume == "enc" else []
            node.cli("volume", "create", volume, "--pool", "bench", "--size", SIZE, *extra)
            node.cli("volume", "attach", volume, "--host", "bench")
            node.bench(volume, "write", 8, "128k", None)
        runs = {figure(load): {volume: [] for volume in VOLUMES} for load in LOADS}
        for round_index in range(args.rounds):
            for load in LOADS:
                order = VOLUMES if round_index % 2 == 0 else VOLUMES[::-1]
                for volume in order:
                    before = node.cpu_seconds()
                    result = node.bench(volume, load[0], load[1], load[2], args.runtime)
                    spent = node.cpu_seconds() - before
                    result["cpu_us_per_io"] = spent * 1e6 / max(result["ios"], 1)
                    runs[figure(load)][volume].append(result)
    finally:
        node.stop()
    summary = {}
    print(f"{'load':<22} {'plain':>12} {'enc':>12} {'enc/plain':>9}   "
          f"{'p99 plain':>9} {'p99 enc':>9}   {'cpu us/io plain':>15} {'enc':>6}")
    for load in LOADS:
        name = figure(load)
        unit = "mib_s" if load[2] == "128k" else "iops"
        med = {v: {k: statistics.median(r[k] for r in runs[name][v])
                   for k in ("iops", "mib_s", "mean_us", "p99_us", "cpu_us_per_io")}
               for v in VOLUMES}
        ratio = med["enc"][unit] / med["plain"][unit] if med["plain"][unit] else 0
        summary[name] = {"unit": unit, "plain": med["plain"], "enc": med["enc"],
                         "ratio": ratio}
        suffix = " MiB/s" if unit == "mib_s" else ""
        print(f"{name:<22} {med['plain'][unit]:>9.0f}{suffix or '   '} "
              f"{med['enc'][unit]:>9.0f}{suffix or '   '} {ratio:>9.2f}   "
              f"{med['plain']['p99_us']:>9.0f} {med['enc']['p99_us']:>9.0f}   "
              f"{med['plain']['cpu_us_per_io']:>15.1f} {med['enc']['cpu_us_per_io']:>6.1f}")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as file:
        json.dump({"runtime": args.runtime, "rounds": args.rounds, "summary": summary,
                   "runs": runs}, file, indent=1)
    print(f"(medians of {args.rounds} rounds of {args.runtime}; JSON: {args.json})")


if __name__ == "__main__":
    main()
