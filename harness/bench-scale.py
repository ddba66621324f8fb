#!/usr/bin/env python3
"""How weft's costs grow with a cluster's size, one machine standing in for a
data centre: a three-member etcd and NODES `weft serve` processes on loopback
(one reactor each, a thin pool each; their data and etcd's on a tmpfs,
standing in for a disk of each one's own), HOSTS hosts, and volumes created
in steps up to each of COUNTS (every third one replicated, three copies;
each attached to a host), through the API of node n1 by four clients at once.

At each step:
  - create and attach latency (p50, p99) of the step's volumes, and
    `volume list` through n1 (it gathers every node's volumes);
  - etcd's writes (puts, deletes, transactions) and the watch events it sent
    per second over 10 s at rest, read from its /metrics;
  - the nodes' CPU over those 10 s (percent of one core, all nodes), their
    threads, and their resident memory per copy they hold.
Then, at the largest count: the same etcd figures during a churn of creates
and deletes, and the node holding the most replicated primaries killed
(SIGKILL): the time until the cluster lists it down and until every one of
its replicated volumes has another primary.

Prints a table (count on the left) and writes JSON (default
.cache/bench/scale/result.json).

Usage: harness/bench-scale.py [--weft target/release/weft] [--nodes 32]
       [--counts 100,1000,10000] [--hosts 1000] [--clients 4] [--json FILE]
       (a benchmark: outside CI; --nodes 6 --counts 30,90 --hosts 20 is the smoke)
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request

from harness_module import load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ETCD_CLIENT, ETCD_PEER, NVME, API = 24791, 24801, 16000, 16200
VOLUME_BYTES = 16 << 20


bench_cluster = load("bench-cluster")
quantile, rss_kib = bench_cluster.quantile, bench_cluster.rss_kib


def threads(pid):
    return bench_cluster.proc_status(pid, "Threads")


class ScaleCluster(bench_cluster.Cluster):
    """bench-cluster.py's cluster with `nodes` nodes and a three-member etcd."""

    def __init__(self, weft, work, nodes, data_root, lease_ms):
        super().__init__(weft, work)
        self.node_count = nodes
        self.lease_ms = lease_ms
        # etcd's members and the nodes keep their data here (tmpfs by
        # default): one disk shared by three etcd members' fsyncs and 32
        # nodes is not what a data centre gives each of them.
        self.data_root = data_root
        self.etcd_urls = [f"http://127.0.0.1:{ETCD_CLIENT + i}" for i in range(3)]
        self.etcd_url = ",".join(self.etcd_urls)

    def start(self):
        self.ssl = None
        peers = [f"http://127.0.0.1:{ETCD_PEER + i}" for i in range(3)]
        initial = ",".join(f"e{i}={peer}" for i, peer in enumerate(peers))
        for i in range(3):
            log = open(os.path.join(self.work, f"etcd{i}.log"), "w")
            self.processes.append(subprocess.Popen(
                ["etcd", "--name", f"e{i}", "--data-dir", os.path.join(self.data_root, f"etcd{i}"),
                 "--listen-client-urls", self.etcd_urls[i],
                 "--advertise-client-urls", self.etcd_urls[i],
                 "--listen-peer-urls", peers[i], "--initial-advertise-peer-urls", peers[i],
                 "--initial-cluster", initial, "--initial-cluster-state", "new"],
                stdout=subprocess.DEVNULL, stderr=log))
        self.wait(lambda: subprocess.run(
            ["etcdctl", "--endpoints", self.etcd_url, "endpoint", "health"],
            capture_output=True, env=dict(os.environ, ETCDCTL_API="3")).returncode == 0,
            "etcd's three members")
        token_file = os.path.join(self.data_root, "n1", "api-token")
        for index in range(self.node_count):
            name = f"n{index + 1}"
            data = os.path.join(self.data_root, name)
            os.makedirs(data, exist_ok=True)
            args = [self.weft, "serve", "--cluster", self.etcd_url, "--node", name,
                    "--listen", f"127.0.0.1:{NVME + index}",
                    "--api-listen", f"127.0.0.1:{API + index}", "--data-dir", data,
                    "--reactors", "1", "--insecure-store"] + self.serve_args
            if index > 0:
                args += ["--api-token-file", token_file]
            if self.lease_ms:
                config = os.path.join(self.work, f"{name}.toml")
                with open(config, "w") as out:
                    out.write(f'[cluster]\nendpoints = {json.dumps(self.etcd_urls)}\n'
                              f'node = "{name}"\nlease_ttl_ms = {self.lease_ms}\n')
                args += ["--config", config]
            log = open(os.path.join(self.work, f"{name}.log"), "a")
            self.processes.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log))
            self.nodes.append({"name": name, "api": f"http://127.0.0.1:{API + index}",
                               "nvme": f"127.0.0.1:{NVME + index}",
                               "pid": self.processes[-1].pid, "args": args,
                               "process": len(self.processes) - 1})
            if index == 0:
                self.wait(lambda: os.path.exists(token_file), "n1's token")
                self.token = open(token_file).read().strip()
        for node in self.nodes:
            self.wait(lambda: self.call(node, "GET", "stats")[0] == 200, node["name"])

    def stop(self):
        super().stop()
        shutil.rmtree(self.data_root, ignore_errors=True)


def etcd_counters(url):
    """etcd's (writes, watch events sent) so far, from one member's /metrics."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    writes = sum(values.get(k, 0) for k in
                 ["etcd_mvcc_put_total", "etcd_mvcc_delete_total", "etcd_mvcc_txn_total"])
    return writes, values.get("etcd_debugging_mvcc_events_total", 0)


def etcd_rates(cluster, seconds, work=None):
    """etcd's writes and watch events per second over `seconds` (while `work`
    runs, if given: it is called until the time is up)."""
    start_writes, start_events = etcd_counters(cluster.etcd_urls[0])
    start = time.perf_counter()
    done = 0
    while time.perf_counter() - start < seconds:
        if work:
            work(done)
            done += 1
        else:
            time.sleep(0.1)
        elapsed = time.perf_counter() - start
    writes, events = etcd_counters(cluster.etcd_urls[0])
    return {"writes_per_s": (writes - start_writes) / elapsed,
            "watch_events_per_s": (events - start_events) / elapsed, "operations": done}


# Calls answered 503 (a node down or busy), retried: on 2 cores 32 nodes
# starve one another, and a node that misses its lease is down until it
# joins again; what a script of a user's would do, counted.
REFUSED = {"busy": 0, "node_down": 0, "unavailable": 0}
REFUSED_LOCK = threading.Lock()


def timed_call(cluster, method, path, body):
    """Milliseconds until `method path` succeeded through n1 (retried for up
    to 60 s while the cluster answers 503)."""
    start = time.perf_counter()
    retried = False
    while True:
        status, answer = cluster.call(cluster.nodes[0], method, path, body)
        # A retried create answered "exists": the first attempt was made
        # after all, its answer lost.
        if status in (200, 201, 204) or (retried and status == 409):
            return (time.perf_counter() - start) * 1000
        code = (answer or {}).get("code", "") if isinstance(answer, dict) else ""
        if status != 503 or time.perf_counter() - start > 60:
            sys.exit(f"bench-scale: {method} {path}: {status} {answer}")
        with REFUSED_LOCK:
            REFUSED[code if code in REFUSED else "unavailable"] += 1
        retried = True
        time.sleep(0.2)


def make_volumes(cluster, first, last, hosts, clients):
    """Creates and attaches volumes v{first}..v{last - 1}: their latencies (ms)."""
    def one(index):
        body = {"name": f"v{index}", "size_bytes": VOLUME_BYTES}
        if index % 3 == 2:
            body["replicas"] = 3
        create = timed_call(cluster, "POST", "volumes", body)
        attach = timed_call(cluster, "POST", f"volumes/v{index}/hosts",
                            {"host": f"h{index % hosts}"})
        return create, attach
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        done = list(pool.map(one, range(first, last)))
    return [c for c, _ in done], [a for _, a in done]


def cpu_seconds(pid):
    """User and system CPU seconds process `pid` used so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    # utime and stime are fields 14 and 15; the split starts at field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def copies_held(count):
    """Copies the cluster holds for `count` volumes (every third has three)."""
    replicated = sum(1 for index in range(count) if index % 3 == 2)
    return count + 2 * replicated


def step_figures(cluster, count, create_ms, attach_ms, rss_before):
    list_ms = [timed_call(cluster, "GET", "volumes", None) for _ in range(5)]
    listed = len(cluster.must(cluster.nodes[0], "GET", "volumes"))
    if listed != count:
        sys.exit(f"bench-scale: {listed} volumes listed, {count} made")
    grown = sum(rss_kib(node["pid"]) - rss_before[node["name"]] for node in cluster.nodes)
    cpu_before, start = sum(cpu_seconds(n["pid"]) for n in cluster.nodes), time.perf_counter()
    at_rest = etcd_rates(cluster, 10)
    cpu = sum(cpu_seconds(n["pid"]) for n in cluster.nodes) - cpu_before
    return {"count": count,
            "create_ms_p50": quantile(create_ms, 0.5), "create_ms_p99": quantile(create_ms, 0.99),
            "attach_ms_p50": quantile(attach_ms, 0.5), "attach_ms_p99": quantile(attach_ms, 0.99),
            "list_ms_p50": quantile(list_ms, 0.5), "list_ms_max": max(list_ms),
            "etcd_at_rest": at_rest,
            "nodes_cpu_pct_at_rest": 100 * cpu / (time.perf_counter() - start),
            "threads_per_node": sum(threads(n["pid"]) for n in cluster.nodes) / len(cluster.nodes),
            "rss_kib_per_copy": grown / copies_held(count),
            "rss_mib_nodes": sum(rss_kib(node["pid"]) for node in cluster.nodes) / 1024}


def churn(cluster):
    """One create and one delete of a volume of one copy (a churn step)."""
    def step(index):
        name = f"churn{index}"
        timed_call(cluster, "POST", "volumes", {"name": name, "size_bytes": VOLUME_BYTES})
        timed_call(cluster, "DELETE", f"volumes/{name}", None)
    return step


def leases_lost(work):
    """How often a node lost its lease (starved of CPU or of etcd's answers)."""
    lost = 0
    for name in os.listdir(work):
        if name.endswith(".log") and name.startswith("n"):
            lost += open(os.path.join(work, name)).read().count("its lease ended (")
    return lost


def failover(cluster):
    """Kills the node with the most replicated primaries: seconds until it is
    listed down and until each of its replicated volumes has a new primary."""
    volumes = cluster.must(cluster.nodes[0], "GET", "volumes")
    primaries = {}
    for volume in volumes:
        for replica in volume.get("replicas") or []:
            if replica["role"] == "primary":
                primaries.setdefault(replica["node"], []).append(volume["name"])
    name = max(primaries, key=lambda n: len(primaries[n]))
    victim = next(node for node in cluster.nodes if node["name"] == name)
    via = next(node for node in cluster.nodes if node is not victim)
    process = cluster.processes[victim["process"]]
    process.kill()
    killed = time.perf_counter()
    process.wait()
    down_s = None
    waiting = set(primaries[name])
    while time.perf_counter() - killed < 120:
        if down_s is None:
            nodes = cluster.must(via, "GET", "nodes")
            if any(n["name"] == name and n["state"] == "down" for n in nodes):
                down_s = time.perf_counter() - killed
        # Each volume asked for by name (routed to the primary its record
        # names): moved once a live node answers with another primary.
        for volume in sorted(waiting):
            status, shown = cluster.call(via, "GET", f"volumes/{volume}")
            if status == 200 and any(r["role"] == "primary" and r["node"] != name
                                     for r in shown.get("replicas") or []):
                waiting.discard(volume)
        if down_s is not None and not waiting:
            return {"node": name, "primaries": len(primaries[name]), "down_s": down_s,
                    "all_moved_s": time.perf_counter() - killed}
        time.sleep(0.1)
    sys.exit(f"bench-scale: {name}'s primaries not moved within 120 s")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--weft", default=os.path.join(ROOT, "target/release/weft"))
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--counts", default="100,1000,10000")
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=4, help="API calls in flight at once")
    parser.add_argument("--lease-ms", type=int, default=10000,
                        help="each node's lease_ttl_ms: 32 nodes share 2 cores here, and a"
                             " node starved for the default 3 s would be taken for dead")
    parser.add_argument("--data", default="/dev/shm",
                        help="under which etcd and the nodes keep their data (in a directory"
                             " weft-bench-scale it makes and removes; a tmpfs by default)")
    parser.add_argument("--json", default=os.path.join(ROOT, ".cache/bench/scale/result.json"))
    parser.add_argument("--hold-s", type=int, default=0,
                        help="keep the cluster at rest this long after the last step (to"
                             " profile it: the nodes' pids are in the work directory's log)")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    work = os.path.join(ROOT, ".cache/bench/scale/run")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(args.data, "weft-bench-scale")
    shutil.rmtree(data, ignore_errors=True)
    cluster = ScaleCluster(args.weft, work, args.nodes, data, args.lease_ms)
    result = {"nodes": args.nodes, "hosts": args.hosts, "clients": args.clients,
              "lease_ms": args.lease_ms, "steps": []}
    try:
        start = time.perf_counter()
        cluster.start()
        result["start_s"] = time.perf_counter() - start
        result["etcd_idle"] = etcd_rates(cluster, 10)
        rss_before = {node["name"]: rss_kib(node["pid"]) for node in cluster.nodes}
        result["rss_mib_node_idle"] = sum(rss_before.values()) / 1024 / args.nodes
        for node in cluster.nodes:
            cluster.must(cluster.nodes[0], "POST", "pools", {
                "name": "p", "node": node["name"],
                "devices": [os.path.join(cluster.data_root, node["name"], "p.img")],
                "device_size_bytes": 64 << 30})
        cluster.wait(lambda: all(len(n["pools"]) == 1
                                 for n in cluster.must(cluster.nodes[0], "GET", "nodes")),
                     "heartbeats with pools", limit=60)
        host_ms = [timed_call(cluster, "POST", "hosts", {
            "name": f"h{index}", "nqn": f"nqn.2014-08.org.nvmexpress:uuid:scale-host-{index}"})
            for index in range(args.hosts)]
        result["host_create_ms_p50"] = quantile(host_ms, 0.5)
        result["host_create_ms_p99"] = quantile(host_ms, 0.99)
        made = 0
        for count in counts:
            create_ms, attach_ms = make_volumes(cluster, made, count, args.hosts, args.clients)
            made = count
            result["steps"].append(step_figures(cluster, count, create_ms, attach_ms, rss_before))
            print(f"bench-scale: {count} volumes", file=sys.stderr)
            write_json(args.json, result)  # what a later step's failure leaves
        if args.hold_s:
            print(f"bench-scale: holding for {args.hold_s} s; nodes' pids:"
                  f" {' '.join(str(n['pid']) for n in cluster.nodes)}", file=sys.stderr)
            time.sleep(args.hold_s)
        result["etcd_churn"] = etcd_rates(cluster, 10, churn(cluster))
        result["refused_503"] = dict(REFUSED)
        result["leases_lost"] = leases_lost(work)
        result["failover"] = failover(cluster)
    finally:
        cluster.stop()
    report(result)
    write_json(args.json, result)
    print(f"bench-scale: JSON in {args.json}")


def write_json(path, result):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as out:
        json.dump(result, out, indent=2)


def report(result):
    print(f"{result['nodes']} nodes, {result['hosts']} hosts (create p50"
          f" {result['host_create_ms_p50']:.1f} ms, p99 {result['host_create_ms_p99']:.1f} ms);"
          f" started in {result['start_s']:.1f} s; idle etcd:"
          f" {result['etcd_idle']['writes_per_s']:.1f} writes/s,"
          f" {result['etcd_idle']['watch_events_per_s']:.1f} watch events/s")
    print(f"{'volumes':>8}{'create p50':>11}{'p99':>8}{'attach p50':>11}{'p99':>8}"
          f"{'list p50':>10}{'etcd w/s':>10}{'events/s':>10}{'CPU %':>8}{'threads':>9}"
          f"{'KiB/copy':>10}{'nodes MiB':>10}")
    for step in result["steps"]:
        rest = step["etcd_at_rest"]
        print(f"{step['count']:>8}{step['create_ms_p50']:>11.1f}{step['create_ms_p99']:>8.1f}"
              f"{step['attach_ms_p50']:>11.1f}{step['attach_ms_p99']:>8.1f}"
              f"{step['list_ms_p50']:>10.1f}{rest['writes_per_s']:>10.1f}"
              f"{rest['watch_events_per_s']:>10.1f}{step['nodes_cpu_pct_at_rest']:>8.1f}"
              f"{step['threads_per_node']:>9.0f}{step['rss_kib_per_copy']:>10.1f}"
              f"{step['rss_mib_nodes']:>10.0f}")
    print(f"calls answered 503 and retried: {result['refused_503']}; leases lost by starved"
          f" nodes: {result['leases_lost']}")
    churned = result["etcd_churn"]
    print(f"churn: {churned['operations']} creates and deletes in 10 s,"
          f" etcd {churned['writes_per_s']:.1f} writes/s, {churned['watch_events_per_s']:.1f}"
          f" watch events/s")
    fail = result["failover"]
    print(f"kill -9 of {fail['node']} ({fail['primaries']} replicated primaries): listed down"
          f" after {fail['down_s']:.1f} s, every primary moved after {fail['all_moved_s']:.1f} s")


if __name__ == "__main__":
    main()
