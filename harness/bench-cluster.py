#!/usr/bin/env python3
"""Control-plane figures of a weft cluster on this machine: etcd (one member)
and three `weft serve` nodes on loopback, a pool on each.

Measures, through node n1's API (so most calls are forwarded or gathered):
  - volume create latency (placement, forward, claim in etcd, creation) and
    create-to-servable (until weft's initiator connects to the new volume);
  - with VOLUMES volumes and HOSTS hosts (every volume attached to a host):
    `volume list` latency (gathered from three nodes), create latency,
    keys in etcd, and the resident memory each volume costs a node.
Prints a table and writes JSON (default .cache/bench/cluster/result.json).

Usage: harness/bench-cluster.py [--weft target/release/weft] [--volumes 1000]
       [--hosts 100] [--json FILE]      (a benchmark: outside CI; --volumes 30 is the smoke)
"""

import argparse
import json
import os
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST_NQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000bc1a5"


def quantile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Cluster:
    def __init__(self, weft, work, cluster_toml="", reactors=1, serve_args=(), pki=False,
                 port_offset=0):
        self.weft = weft
        self.work = work
        # More lines of each node's [cluster] table (e.g. "lease_ttl_ms = 3000").
        self.cluster_toml = cluster_toml
        # Each node's reactors (data plane threads).
        self.reactors = reactors
        # More arguments of each `weft serve`.
        self.serve_args = list(serve_args)
        self.processes = []
        # With `pki`, set up as the guide's cluster chapter (docs/guide/04-cluster.md) says: the cluster's
        # CA, etcd over TLS asking for a client certificate, each node with its
        # own (`--pki`: the API over TLS, replication links in TLS); else etcd
        # and the API in the clear (loopback, this run only).
        self.pki = os.path.join(work, "pki") if pki else None
        self.scheme = "https" if pki else "http"
        self.port_offset = port_offset
        self.etcd_url = f"{self.scheme}://127.0.0.1:{23791 + port_offset}"
        self.nodes = []

    def etcd_tls(self):
        """etcd's arguments for TLS, and etcdctl's (etcd's certificate is a client's too)."""
        if not self.pki:
            return [], []
        crt, key, ca = (os.path.join(self.pki, f) for f in ("etcd.crt", "etcd.key", "ca.crt"))
        return (["--cert-file", crt, "--key-file", key, "--client-cert-auth",
                 "--trusted-ca-file", ca],
                ["--cacert", ca, "--cert", crt, "--key", key])

    def start(self):
        if self.pki:
            subprocess.run([self.weft, "cluster", "init", "--pki", self.pki], check=True,
                           stdout=subprocess.DEVNULL)
            for index in range(3):
                subprocess.run([self.weft, "cluster", "issue", f"n{index + 1}", "--pki", self.pki,
                                "--address", "127.0.0.1"], check=True, stdout=subprocess.DEVNULL)
            self.ssl = ssl.create_default_context(cafile=os.path.join(self.pki, "ca.crt"))
        else:
            self.ssl = None
        etcd_log = open(os.path.join(self.work, "etcd.log"), "w")
        peer = f"http://127.0.0.1:{23801 + self.port_offset}"
        server_tls, client_tls = self.etcd_tls()
        self.processes.append(subprocess.Popen(
            ["etcd", "--data-dir", os.path.join(self.work, "etcd"),
             "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"default={peer}"] + server_tls,
            stdout=subprocess.DEVNULL, stderr=etcd_log))
        self.wait(lambda: subprocess.run(
            ["etcdctl", "--endpoints", self.etcd_url] + client_tls + ["put", "bench", "ok"],
            capture_output=True, env=dict(os.environ, ETCDCTL_API="3")).returncode == 0, "etcd")
        for index in range(3):
            name = f"n{index + 1}"
            data = os.path.join(self.work, name)
            os.makedirs(data, exist_ok=True)
            nvme_port = 15600 + index + self.port_offset
            api_port = 15700 + index + self.port_offset
            args = [self.weft, "serve", "--cluster", self.etcd_url, "--node", name,
                    "--listen", f"127.0.0.1:{nvme_port}",
                    "--api-listen", f"127.0.0.1:{api_port}", "--data-dir", data,
                    "--reactors", str(self.reactors)] + self.serve_args
            if self.pki:
                args += ["--pki", os.path.join(self.pki, "nodes", name),
                         "--api-advertise", f"https://127.0.0.1:{api_port}"]
            else:
                args += ["--insecure-store"]
            if index > 0:
                args += ["--api-token-file", os.path.join(self.work, "n1", "api-token")]
            if self.cluster_toml:
                config = os.path.join(self.work, f"{name}.toml")
                with open(config, "w") as out:
                    out.write(f'[cluster]\nendpoints = ["{self.etcd_url}"]\nnode = "{name}"\n'
                              f"{self.cluster_toml}\n")
                args += ["--config", config]
            log = open(os.path.join(self.work, f"{name}.log"), "a")
            self.processes.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log))
            node = {"name": name, "api": f"{self.scheme}://127.0.0.1:{api_port}",
                    "nvme": f"127.0.0.1:{nvme_port}", "pid": self.processes[-1].pid,
                    "args": args, "process": len(self.processes) - 1}
            self.nodes.append(node)
            token_file = os.path.join(self.work, "n1", "api-token")
            self.wait(lambda: os.path.exists(token_file), "n1's token")
            self.token = open(token_file).read().strip()
            self.wait(lambda: self.call(node, "GET", "stats")[0] == 200, name)

    def restart(self, node):
        """Stops `node` (SIGTERM) and starts it again on its data directory."""
        old = self.processes[node["process"]]
        old.send_signal(signal.SIGTERM)
        old.wait(timeout=30)
        log = open(os.path.join(self.work, f"{node['name']}.log"), "a")
        self.processes[node["process"]] = subprocess.Popen(
            node["args"], stdout=subprocess.DEVNULL, stderr=log)
        node["pid"] = self.processes[node["process"]].pid
        self.wait(lambda: self.call(node, "GET", "stats")[0] == 200, node["name"])

    def create_pools(self, device_bytes):
        """Pool "p" on every node (a sparse file of `device_bytes`), through n1."""
        for node in self.nodes:
            device = os.path.join(self.work, node["name"], "p.img")
            self.must(self.nodes[0], "POST", "pools", {"name": "p", "node": node["name"],
                                                       "devices": [device],
                                                       "device_size_bytes": device_bytes})

    def wait(self, check, what, limit=30):
        deadline = time.time() + limit
        while not check():
            if time.time() > deadline:
                sys.exit(f"bench-cluster: {what} did not come up; logs in {self.work}")
            time.sleep(0.1)

    def call(self, node, method, path, body=None):
        request = urllib.request.Request(
            f"{node['api']}/api/v1/{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {getattr(self, 'token', '')}",
                     "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60, context=self.ssl) as answer:
                return answer.status, json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")
        except (urllib.error.URLError, ConnectionError):
            return 0, None

    def must(self, node, method, path, body=None):
        status, answer = self.call(node, method, path, body)
        if status not in (200, 201):
            sys.exit(f"bench-cluster: {method} {path}: {status} {answer}")
        return answer

    def stop(self):
        """Stops every process, then removes what they stored (pools, etcd's data): a
        benchmark leaves gigabytes otherwise. The logs and configs stay."""
        for process in reversed(self.processes):
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for data in ["etcd"] + [node["name"] for node in self.nodes]:
            shutil.rmtree(os.path.join(self.work, data), ignore_errors=True)


def proc_status(pid, field):
    """The number after `field:` in /proc/PID/status (0 if absent)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    return 0


def rss_kib(pid):
    return proc_status(pid, "VmRSS")


def timed(action):
    start = time.perf_counter()
    result = action()
    return (time.perf_counter() - start) * 1000, result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--weft", default=os.path.join(ROOT, "target/release/weft"))
    parser.add_argument("--volumes", type=int, default=1000)
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--json", default=os.path.join(ROOT, ".cache/bench/cluster/result.json"))
    args = parser.parse_args()
    work = os.path.join(ROOT, ".cache/bench/cluster/run")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    cluster = Cluster(args.weft, work)
    try:
        cluster.start()
        n1 = cluster.nodes[0]
        cluster.create_pools(256 << 30)
        rss_before = {node["name"]: rss_kib(node["pid"]) for node in cluster.nodes}
        cluster.wait(lambda: all(len(n["pools"]) == 1 for n in cluster.must(n1, "GET", "nodes")),
                     "heartbeats with pools")
        for index in range(args.hosts):
            nqn = HOST_NQN if index == 0 else f"nqn.2014-08.org.nvmexpress:uuid:bench-host-{index}"
            cluster.must(n1, "POST", "hosts", {"name": f"h{index}", "nqn": nqn})
        create_ms, servable_ms = [], []
        for index in range(args.volumes):
            name = f"v{index}"
            ms, _ = timed(lambda: cluster.must(n1, "POST", "volumes",
                                               {"name": name, "size_bytes": 16 << 20}))
            create_ms.append(ms)
            cluster.must(n1, "POST", f"volumes/{name}/hosts", {"host": f"h{index % args.hosts}"})
            if index % max(1, args.volumes // 20) == 0 and index % args.hosts == 0:
                servable_ms.append(servable(cluster, name, ms))
        list_ms = [timed(lambda: cluster.must(n1, "GET", "volumes"))[0] for _ in range(20)]
        listed = len(cluster.must(n1, "GET", "volumes"))
        late_create_ms = []
        for index in range(20):
            name = f"late{index}"
            late_create_ms.append(timed(lambda: cluster.must(
                n1, "POST", "volumes", {"name": name, "size_bytes": 16 << 20}))[0])
        keys = subprocess.run(["etcdctl", "--endpoints", cluster.etcd_url, "get", "--prefix",
                               "/weft/", "--keys-only"], capture_output=True, text=True,
                              env=dict(os.environ, ETCDCTL_API="3")).stdout.split()
        per_node = {node["name"]: 0 for node in cluster.nodes}
        for volume in cluster.must(n1, "GET", "volumes"):
            per_node[volume["node"]] += 1
        rss_per_volume = [
            (rss_kib(node["pid"]) - rss_before[node["name"]]) / max(1, per_node[node["name"]])
            for node in cluster.nodes]
        # Resident memory grows faster than what a volume holds while volumes
        # are created (the allocator keeps what rebuilding the exports freed);
        # a node started on its volumes shows what they hold.
        n2 = cluster.nodes[1]
        cluster.restart(n2)
        time.sleep(1)
        rss_restarted_per_volume = (rss_kib(n2["pid"]) - rss_before["n2"]) / max(1, per_node["n2"])
        result = {
            "volumes": args.volumes, "hosts": args.hosts, "listed": listed,
            "create_ms_p50": quantile(create_ms, 0.5), "create_ms_p99": quantile(create_ms, 0.99),
            "servable_ms_p50": quantile(servable_ms, 0.5),
            "servable_ms_p99": quantile(servable_ms, 0.99),
            "servable_samples": len(servable_ms),
            "list_ms_p50": quantile(list_ms, 0.5), "list_ms_p99": quantile(list_ms, 0.99),
            "create_at_scale_ms_p50": quantile(late_create_ms, 0.5),
            "create_at_scale_ms_p99": quantile(late_create_ms, 0.99),
            "etcd_keys": len(keys),
            "rss_kib_per_volume": statistics.mean(rss_per_volume),
            "rss_kib_per_volume_after_restart": rss_restarted_per_volume,
            "volumes_per_node": per_node,
        }
    finally:
        cluster.stop()
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as out:
        json.dump(result, out, indent=2)
    print(f"{'figure':<44} {'p50':>10} {'p99':>10}")
    for label, key in [("volume create (through n1, ms)", "create_ms"),
                       ("create to servable (ms)", "servable_ms"),
                       (f"volume list, {args.volumes} volumes (ms)", "list_ms"),
                       (f"create with {args.volumes} volumes (ms)", "create_at_scale_ms")]:
        print(f"{label:<44} {result[key + '_p50']:>10.1f} {result[key + '_p99']:>10.1f}")
    print(f"keys in etcd: {result['etcd_keys']} ({args.volumes + 20} volumes, {args.hosts} hosts,"
          f" 3 nodes); volumes per node {per_node}")
    print(f"resident memory per volume on a node: {result['rss_kib_per_volume']:.0f} KiB grown"
          f" while creating, {result['rss_kib_per_volume_after_restart']:.1f} KiB after a restart")
    print(f"(JSON: {args.json})")


def servable(cluster, name, create_ms):
    """Milliseconds from the create call until weft's initiator reads the new
    volume (the create's own time plus the wait after it)."""
    owner = next(v for v in cluster.must(cluster.nodes[0], "GET", "volumes")
                 if v["name"] == name)["node"]
    nvme = next(n for n in cluster.nodes if n["name"] == owner)["nvme"]
    url = f"nvme-tcp://{nvme}/nqn.2026-11.io.weft:vol:{name}"
    start = time.perf_counter()
    while True:
        done = subprocess.run([cluster.weft, "bench", "--target", url, "--hostnqn", HOST_NQN,
                               "--rw", "read", "--size", "4k"], capture_output=True)
        if done.returncode == 0:
            return create_ms + (time.perf_counter() - start) * 1000
        if time.perf_counter() - start > 10:
            sys.exit(f"bench-cluster: {name} not servable: {done.stderr.decode()}")


if __name__ == "__main__":
    main()
