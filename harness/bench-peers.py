#!/usr/bin/env python3
"""weft beside Ceph RBD, in one run, on this machine: what a user who wants
replicated block storage on commodity servers would otherwise pick.

  - Ceph: Debian's 16.2 started by hand on loopback (harness/ceph.py): one
    monitor, one manager, three OSDs (BlueStore on sparse files beside
    weft's pools), an image in a replicated pool of size 3 (min_size 2) and
    one whose data is in an erasure-coded pool of 2+1.
  - weft: etcd and three `weft serve` nodes on loopback (harness/bench-cluster.py),
    a pool on each (a sparse file of the OSDs' size), a volume of three
    replicas and one erasure-coded 2+1, primaries on n1.

The same client for both: Debian's fio, with its `rbd` engine (librbd) for
Ceph and weft's engine (target/release/libweft_fio.so) for weft. Each image
and volume is written whole first. Then, alternated per round (the side
that goes first alternates too): 4 KiB random read and write at QD1 and
QD32, 128 KiB sequential write at QD8 and a 70/30 random mix at QD16; each
figure with the CPU time of every storage process (Ceph: monitor, manager,
OSDs; weft: nodes and etcd) and of the client (fio with its engine) per
100K I/Os.

Failover (replicated, with a writer at 4 KiB QD1): kill -9 of the process
serving the primary (weft: the primary's node; Ceph: the OSD primary for the
image's first object), writes going on for --outage, then the process
started again; and the same with the process frozen (SIGSTOP, then SIGCONT):
a host that hangs or loses power refuses no connection, so Ceph's peers
cannot tell at once that its OSD is gone. the writer's pause (weft: kill to the first write
acknowledged through a surviving node, as a multipath host retries; Ceph:
the longest gap between two completions in fio's per-I/O log), the I/Os
that failed, and the time and bytes of the catch-up until every copy is in
sync (weft) or every placement group active+clean (Ceph).

Prints a table and writes JSON (default .cache/bench/peers/result.json).

Usage: harness/bench-peers.py [--weft target/release/weft] [--engine PATH]
       [--runtime 10] [--rounds 3] [--size-mib 1024] [--outage 10]
       [--failover kill,freeze|kill|freeze|] [--json FILE]
       (a benchmark: outside CI; --runtime 1 --rounds 1 --size-mib 128
       --osd-gib 2 --outage 2 --failover kill is the smoke)
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

from harness_module import load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST_NQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000bc1a5"
# (name, fio rw, block size, queue depth)
LOADS = [("randread_4k_qd1", "randread", "4k", 1), ("randwrite_4k_qd1", "randwrite", "4k", 1),
         ("randread_4k_qd32", "randread", "4k", 32),
         ("randwrite_4k_qd32", "randwrite", "4k", 32),
         ("write_128k_qd8", "write", "128k", 8), ("randrw70_4k_qd16", "randrw", "4k", 16)]
# (weft volume or Ceph image, kind)
TARGETS = [("rep", "3 replicas"), ("ec", "erasure-coded 2+1")]


ceph_module = load("ceph")
replication = load("bench-replication")
Cluster = load("bench-cluster").Cluster


def cpu_seconds(pids):
    """User and system CPU time of processes `pids` so far (0 for one gone)."""
    hz = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            stat = open(f"/proc/{pid}/stat").read()
            fields = stat[stat.rindex(")") + 2:].split()
            total += (int(fields[11]) + int(fields[12])) / hz
        except (OSError, ValueError, TypeError):
            pass
    return total


class WeftSide:
    name = "weft"

    def __init__(self, args, work):
        self.engine = os.path.realpath(args.engine)
        self.cluster = Cluster(args.weft, work, port_offset=50)
        self.size = args.size_mib << 20

    def start(self, device_bytes):
        cluster = self.cluster
        cluster.start()
        n1 = cluster.nodes[0]
        cluster.create_pools(device_bytes)
        cluster.wait(lambda: all(len(n["pools"]) == 1 for n in cluster.must(n1, "GET", "nodes")),
                     "heartbeats with pools")
        cluster.must(n1, "POST", "hosts", {"name": "bench", "nqn": HOST_NQN})
        cluster.must(n1, "POST", "volumes", {"name": "rep", "size_bytes": self.size,
                                             "node": "n1", "replicas": 3})
        cluster.must(n1, "POST", "volumes", {"name": "ec", "size_bytes": self.size,
                                             "node": "n1", "ec": "2+1"})
        for volume, _ in TARGETS:
            cluster.must(n1, "POST", f"volumes/{volume}/hosts", {"host": "bench"})
            cluster.wait(lambda: self.in_sync(volume) == 3, f"{volume}'s copies in sync", 60)
            cluster.wait(lambda: replication.write_once(cluster, n1, volume), f"{volume} served",
                         60)

    def in_sync(self, volume, via=None):
        replicas = replication.replicas(self.cluster, volume, via)
        return sum(r["state"] == "in-sync" for r in replicas)

    def fio_target(self, volume, node=None):
        node = node or self.cluster.nodes[0]
        host, port = node["nvme"].split(":")
        url = f"nvme-tcp\\://{host}\\:{port}/nqn.2026-11.io.weft\\:vol\\:{volume}"
        return [f"--ioengine=external:{self.engine}", f"--filename={url}"]

    def env(self):
        return dict(os.environ, WEFT_HOSTNQN=HOST_NQN)

    def pids(self):
        return [process.pid for process in self.cluster.processes if process.poll() is None]

    def version(self):
        done = subprocess.run([self.cluster.weft, "--version"], capture_output=True, text=True)
        return done.stdout.strip() or "weft"

    def stop(self):
        self.cluster.stop()

    def failover(self, mode, outage_s, work):
        """Kills (or freezes) the primary's node under a QD1 writer, writes on
        through the new primary for `outage_s`, starts (or thaws) the node
        again: the figures."""
        cluster = self.cluster
        n1 = cluster.nodes[0]
        victim = next(n for n in cluster.nodes if n["name"] == replication.primary_of(cluster, n1))
        others = [n for n in cluster.nodes if n is not victim]
        prefix = os.path.join(work, f"weft-{mode}-writer")
        writer = fio_process(self.fio_target("rep", victim), "randwrite", "4k", 1, 120, self.size,
                             prefix, self.env())
        time.sleep(3)
        process = cluster.processes[victim["process"]]
        if mode == "kill":
            process.kill()
            process.wait()
        else:
            process.send_signal(signal.SIGSTOP)
        killed = time.perf_counter()
        survivor = None
        while survivor is None and time.perf_counter() - killed < 60:
            survivor = next((n for n in others if replication.write_once(cluster, n)), None)
            time.sleep(0.01)
        if survivor is None:
            sys.exit("bench-peers: no write acknowledged within 60 s of killing the primary's node")
        pause = time.perf_counter() - killed
        if mode == "freeze":
            # Its I/O waits on the frozen path (a kernel host retries it
            # elsewhere after its I/O timeout); the next ones go elsewhere.
            writer.kill()
        try:
            writer.wait(timeout=60)
        finally:
            if writer.poll() is None:
                writer.kill()
        failed = fio_errors(prefix + ".json", writer.returncode) if mode == "kill" else 0
        # Writes go on through the new primary for the rest of the outage.
        new_primary = next(n for n in others if n["name"] == replication.primary_of(cluster, survivor))
        rest = max(1, round(outage_s - (time.perf_counter() - killed)))
        subprocess.run(fio_command(self.fio_target("rep", new_primary), "randwrite", "4k", 1,
                                   rest, self.size) + ["--output=/dev/null"],
                       env=self.env(), check=True)
        started = time.perf_counter()
        if mode == "kill":
            log = open(os.path.join(cluster.work, f"{victim['name']}.log"), "a")
            cluster.processes[victim["process"]] = subprocess.Popen(
                victim["args"], stdout=subprocess.DEVNULL, stderr=log)
        else:
            process.send_signal(signal.SIGCONT)
        copied = 0
        # (Asked of the new primary's node: one just thawed answers from
        # its copy of the store as it was when it froze, for a moment.)
        while self.in_sync("rep", new_primary) < 3:
            if time.perf_counter() - started > 300:
                sys.exit("bench-peers: weft's replica not in sync within 300 s of its restart")
            for replica in replication.replicas(cluster, "rep", new_primary):
                copied = max(copied, (replica.get("rebuild") or {}).get("total_bytes", 0))
            time.sleep(0.05)
        return {"pause_s": pause, "failed_ios": failed,
                "catch_up_s": time.perf_counter() - started, "catch_up_bytes": copied}


class CephSide:
    name = "ceph"

    def __init__(self, args, work):
        ceph_module.require()
        self.ceph = ceph_module.Ceph(work, args.osd_bytes)
        self.size = args.size_mib << 20

    def start(self, device_bytes):
        self.ceph.start(self.size)

    def fio_target(self, image, node=None):
        return ["--ioengine=rbd", "--clientname=admin", "--pool=rbd", f"--rbdname={image}"]

    def env(self):
        return self.ceph.env

    def pids(self):
        return [pid for pid in self.ceph.pids() if pid]

    def version(self):
        return self.ceph.version()

    def stop(self):
        self.ceph.stop()

    def failover(self, mode, outage_s, work):
        """Kills (or freezes) the OSD primary for the image's first object
        under a QD1 writer that goes on for `outage_s`, starts (or thaws) it
        again: the figures."""
        osd = self.ceph.primary_osd("rep")
        prefix = os.path.join(work, f"ceph-{mode}-writer")
        writer = fio_process(self.fio_target("rep") + [
            f"--write_lat_log={prefix}", "--log_avg_msec=0", "--continue_on_error=all"],
            "randwrite", "4k", 1, 3 + outage_s, self.size, prefix, self.env())
        time.sleep(3)
        pid = self.ceph.pid(f"osd.{osd}")
        if mode == "kill":
            self.ceph.kill_osd(osd)
        else:
            os.kill(pid, signal.SIGSTOP)
        try:
            writer.wait(timeout=outage_s + 300)
        finally:
            if writer.poll() is None:
                writer.kill()
        failed = fio_errors(prefix + ".json", writer.returncode)
        pause = longest_gap(f"{prefix}_lat.1.log")
        before = self.ceph.recovered_bytes()
        started = time.perf_counter()
        if mode == "kill":
            self.ceph.start_osd(osd)
        else:
            os.kill(pid, signal.SIGCONT)
        self.ceph.wait_clean(300)
        catch_up = time.perf_counter() - started
        # Primaries report their statistics every few seconds: read until steady.
        copied, last = self.ceph.recovered_bytes() - before, -1
        for _ in range(10):
            if copied == last:
                break
            time.sleep(1)
            copied, last = self.ceph.recovered_bytes() - before, copied
        return {"pause_s": pause, "failed_ios": failed, "catch_up_s": catch_up,
                "catch_up_bytes": max(copied, 0), "killed": f"osd.{osd}"}


def fio_command(target, rw, bs, iodepth, runtime_s, size, ramp_s=0):
    command = ["fio", "--name=peer", f"--rw={rw}", f"--bs={bs}", f"--iodepth={iodepth}",
               f"--size={size}", "--norandommap", "--randrepeat=0", "--output-format=json"]
    if rw == "randrw":
        command.append("--rwmixread=70")
    if runtime_s:
        command += ["--time_based", f"--runtime={runtime_s}"]
    if ramp_s:
        command.append(f"--ramp_time={ramp_s}")
    return command + target


def fio_process(target, rw, bs, iodepth, runtime_s, size, prefix, env):
    return subprocess.Popen(
        fio_command(target, rw, bs, iodepth, runtime_s, size) + [f"--output={prefix}.json"],
        env=env, stdout=subprocess.DEVNULL, stderr=open(prefix + ".err", "w"))


def fio_errors(json_file, returncode):
    """I/Os a writer saw fail (fio's total_err; 1 when fio stopped at an
    error before writing its report)."""
    try:
        text = open(json_file).read()
        report = json.loads(text[text.index("{"):])
        return report["jobs"][0].get("total_err", 0) or (1 if returncode else 0)
    except (OSError, ValueError, KeyError):
        return 1 if returncode else 0


def longest_gap(lat_log):
    """Seconds of the longest wait between two completions in fio's
    per-I/O log (each line: completion ms, latency ns, direction, size, offset)."""
    times = [int(line.split(",")[0]) for line in open(lat_log) if line.strip()]
    return max((b - a for a, b in zip(times, times[1:])), default=0) / 1000


def run_load(side, target, load, runtime_s, size):
    """One fio run of `load` on `target`: its figures, with CPU per 100K I/Os."""
    _, rw, bs, iodepth = load
    pids = side.pids()
    before = cpu_seconds(pids)
    ramp = 1 if runtime_s >= 3 else 0
    done = subprocess.run(fio_command(side.fio_target(target), rw, bs, iodepth, runtime_s, size,
                                      ramp), env=side.env(), capture_output=True, text=True)
    # The CPU counted over the ramp too: scaled to the measured time.
    storage_cpu = cpu_seconds(pids) - before
    if done.returncode != 0:
        sys.exit(f"bench-peers: fio {load[0]} on {side.name} {target}: {done.stderr.strip()}")
    job = json.loads(done.stdout[done.stdout.index("{"):])["jobs"][0]
    sides = [job[d] for d in ("read", "write") if job[d]["total_ios"]]
    ios = sum(s["total_ios"] for s in sides)
    measured_s = job["job_runtime"] / 1000
    storage_cpu *= measured_s / (measured_s + ramp)
    client_cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100 * measured_s
    mean_us = sum(s["clat_ns"]["mean"] * s["total_ios"] for s in sides) / max(ios, 1) / 1000
    p99_us = max(s["clat_ns"]["percentile"]["99.000000"] for s in sides) / 1000
    return {"iops": sum(s["iops"] for s in sides), "mean_us": mean_us, "p99_us": p99_us,
            "mib_s": sum(s["bw_bytes"] for s in sides) / (1 << 20),
            "storage_cpu_s_per_100k": storage_cpu / max(ios, 1) * 1e5,
            "client_cpu_s_per_100k": client_cpu / max(ios, 1) * 1e5}


def merge(runs):
    """Median of every figure over the rounds."""
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--weft", default=os.path.join(ROOT, "target/release/weft"))
    parser.add_argument("--engine", default=os.path.join(ROOT, "target/release/libweft_fio.so"))
    parser.add_argument("--runtime", type=int, default=10, help="seconds per fio run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size-mib", type=int, default=1024, help="each image and volume")
    parser.add_argument("--osd-gib", type=int, default=4,
                        help="each OSD's file and each weft node's pool device")
    parser.add_argument("--outage", type=int, default=10, help="seconds of writes while down")
    parser.add_argument("--failover", default="kill,freeze",
                        help="kill (SIGKILL: the process dies, its host answers), freeze"
                             " (SIGSTOP: as a host that hangs or loses power), both, or none")
    parser.add_argument("--json", default=os.path.join(ROOT, ".cache/bench/peers/result.json"))
    args = parser.parse_args()
    args.osd_bytes = args.osd_gib << 30
    work = os.path.join(ROOT, ".cache/bench/peers/run")
    os.makedirs(work, exist_ok=True)
    sides = [WeftSide(args, os.path.join(work, "weft")), CephSide(args, os.path.join(work, "ceph"))]
    os.makedirs(os.path.join(work, "weft"), exist_ok=True)
    results = {"settings": settings(args, sides), "loads": {}, "failover": {}}
    try:
        for side in sides:
            start = time.perf_counter()
            side.start(args.osd_bytes)
            results["settings"][f"{side.name}_start_s"] = time.perf_counter() - start
            for target, _ in TARGETS:
                subprocess.run(fio_command(side.fio_target(target), "write", "128k", 8, None,
                                           side.size) + ["--output=/dev/null"],
                               env=side.env(), check=True)
        runs = {}
        for round_number in range(args.rounds):
            order = sides if round_number % 2 == 0 else sides[::-1]
            for target, _ in TARGETS:
                for load_spec in LOADS:
                    for side in order:
                        key = f"{side.name}_{target}_{load_spec[0]}"
                        runs.setdefault(key, []).append(
                            run_load(side, target, load_spec, args.runtime, side.size))
        results["loads"] = {key: merge(value) for key, value in runs.items()}
        for mode in filter(None, args.failover.split(",")):
            for side in sides:
                results["failover"][f"{side.name}_{mode}"] = side.failover(mode, args.outage, work)
    finally:
        for side in sides:
            side.stop()
    report(results)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as out:
        json.dump(results, out, indent=2)
    print(f"bench-peers: JSON in {args.json}")


def settings(args, sides):
    return {"weft": sides[0].version(), "ceph": sides[1].version(),
            "fio": subprocess.run(["fio", "--version"], capture_output=True,
                                  text=True).stdout.strip(),
            "runtime_s": args.runtime, "rounds": args.rounds, "size_mib": args.size_mib,
            "device_gib": args.osd_gib, "outage_s": args.outage, "cpus": os.cpu_count()}


def report(results):
    print(f"{'load':<22}{'copies':<20}{'weft IOPS':>11}{'ceph IOPS':>11}{'ratio':>7}"
          f"{'weft p99 us':>13}{'ceph p99 us':>13}{'weft CPU':>10}{'ceph CPU':>10}")
    for target, kind in TARGETS if results["loads"] else []:
        for name, *_ in LOADS:
            weft = results["loads"][f"weft_{target}_{name}"]
            ceph = results["loads"][f"ceph_{target}_{name}"]
            print(f"{name:<22}{kind:<20}{weft['iops']:>11.0f}{ceph['iops']:>11.0f}"
                  f"{weft['iops'] / max(ceph['iops'], 1e-9):>6.2f}x"
                  f"{weft['p99_us']:>13.0f}{ceph['p99_us']:>13.0f}"
                  f"{weft['storage_cpu_s_per_100k']:>10.1f}{ceph['storage_cpu_s_per_100k']:>10.1f}")
    print("(CPU: seconds of every storage process per 100K I/Os)")
    for name, figures in results["failover"].items():
        print(f"failover {name}: writer paused {figures['pause_s']:.2f} s, "
              f"{figures['failed_ios']} I/Os failed; caught up in {figures['catch_up_s']:.1f} s, "
              f"{figures['catch_up_bytes'] / (1 << 20):.1f} MiB copied")


if __name__ == "__main__":
    main()
