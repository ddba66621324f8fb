#!/usr/bin/env python3
"""Checks deploy/monitoring against the real things: promtool checks and
unit-tests the alerting rules and checks the example configuration; a real
`weft serve` (a pool, a volume, I/O through weft bench) and a real Prometheus
scraping it with the read-only token then show that every metric the
dashboards and rules name is one weft exports, that every dashboard query is
valid PromQL with data behind it, and that the rules evaluate without error.

Usage: harness/check-monitoring.py [--weft target/release/weft]
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MONITORING = os.path.join(ROOT, "deploy", "monitoring")
RULES = os.path.join(MONITORING, "prometheus", "weft-alerts.yml")
HOST_NQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000a1e7"
NVME, API, PROMETHEUS = "127.0.0.1:14480", "127.0.0.1:14481", "127.0.0.1:14482"
# Queries whose answer must not be empty once the node served I/O.
MUST_ANSWER = ["Nodes reporting", "IOPS", "Allocated, by pool", "Latency"]


def fail(message):
    sys.exit(f"check-monitoring: {message}")


def run(*args, **kwargs):
    done = subprocess.run(args, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        fail(f"{' '.join(args)}:\n{done.stdout}{done.stderr}")
    return done.stdout


def promtool_checks(scratch):
    run("promtool", "check", "rules", RULES)
    run("promtool", "test", "rules", "weft-alerts.test.yml", cwd=os.path.dirname(RULES))
    tested = set(re.findall(r"alertname: (\w+)", open(RULES.replace(".yml", ".test.yml")).read()))
    defined = set(re.findall(r"- alert: (\w+)", open(RULES).read()))
    if defined - tested:
        fail(f"alerts without a unit test: {sorted(defined - tested)}")
    # The example configuration names a token file that must exist to be checked.
    config_dir = os.path.join(scratch, "example")
    shutil.copytree(os.path.join(MONITORING, "prometheus"), config_dir)
    token = os.path.join(config_dir, "token")
    open(token, "w").write("x\n")
    config = os.path.join(config_dir, "prometheus.yml")
    text = open(config).read().replace("/etc/prometheus/weft-api-token.read-only", token)
    open(config, "w").write(text)
    run("promtool", "check", "config", config)
    print("promtool: rules checked, every alert unit-tested, example configuration valid")


def dashboards():
    """(file, panel title, expression) of every query of every dashboard."""
    queries = []
    for name in sorted(os.listdir(os.path.join(MONITORING, "grafana"))):
        board = json.load(open(os.path.join(MONITORING, "grafana", name)))
        for key in ("uid", "title", "panels", "templating"):
            if key not in board:
                fail(f"{name}: no {key}")
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                queries.append((name, panel["title"], target["expr"]))
        for variable in board["templating"]["list"]:
            if variable["type"] == "query":
                found = re.fullmatch(r"label_values\((\w+), *\w+\)", variable["definition"])
                if not found:
                    fail(f"{name}: variable {variable['name']}: not label_values(METRIC, LABEL)")
                queries.append((name, f"variable {variable['name']}", found.group(1)))
    return queries


def metric_names(expression):
    # Label names (matchers, grouping lists, templates) are not metrics.
    expression = re.sub(r"\{[^{}]*\}", "", expression)
    expression = re.sub(r"\b(by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)", "",
                        expression)
    expression = re.sub(r"\$labels\.\w+", "", expression)
    names = set(re.findall(r"\bweft_[a-z0-9_]+", expression))
    return {re.sub(r"_(bucket|sum|count)$", "", name) for name in names}


class Node:
    def __init__(self, weft, directory):
        self.weft, self.data = weft, os.path.join(directory, "data")
        self.log = open(os.path.join(directory, "serve.log"), "w")
        self.process = subprocess.Popen(
            [weft, "serve", "--data-dir", self.data, "--listen", NVME, "--api-listen", API],
            stdout=self.log, stderr=self.log)
        token = os.path.join(self.data, "api-token")
        deadline = time.time() + 30
        while True:
            if os.path.exists(token):
                self.env = dict(os.environ, WEFT_API=API, WEFT_API_TOKEN=open(token).read().strip())
                if subprocess.run([weft, "pool", "list"], env=self.env,
                                  capture_output=True).returncode == 0:
                    break
            if time.time() > deadline or self.process.poll() is not None:
                fail(f"weft serve did not start (see {directory}/serve.log)")
            time.sleep(0.1)
        self.read_only = os.path.join(self.data, "api-token.read-only")

    def cli(self, *args):
        return run(self.weft, *args, env=self.env)

    def bench(self, seconds):
        url = f"nvme-tcp://{NVME}/nqn.2026-11.io.weft:vol:v1"
        self.cli("bench", "--target", url, "--hostnqn", HOST_NQN, "--rw", "randrw",
                 "--iodepth", "4", "--runtime", f"{seconds}s")

    def exported(self):
        request = urllib.request.Request(
            f"http://{API}/metrics",
            headers={"Authorization": f"Bearer {open(self.read_only).read().strip()}"})
        text = urllib.request.urlopen(request, timeout=10).read().decode()
        return set(re.findall(r"^# TYPE (\w+) ", text, re.MULTILINE))

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)


class Prometheus:
    def __init__(self, directory, token):
        config = os.path.join(directory, "prometheus.yml")
        with open(config, "w") as out:
            out.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["{RULES}"]
scrape_configs:
  - job_name: weft
    authorization: {{type: Bearer, credentials_file: "{token}"}}
    static_configs: [{{targets: ["{API}"]}}]
""")
        self.log = open(os.path.join(directory, "prometheus.log"), "w")
        self.process = subprocess.Popen(
            ["prometheus", f"--config.file={config}",
             f"--storage.tsdb.path={os.path.join(directory, 'tsdb')}",
             f"--web.listen-address={PROMETHEUS}"], stdout=self.log, stderr=self.log)

    def get(self, path, **params):
        url = f"http://{PROMETHEUS}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            return json.load(urllib.request.urlopen(url, timeout=10))
        except urllib.error.HTTPError as error:
            return json.load(error)

    def query(self, expression):
        return self.get("query", query=expression)

    def wait_for(self, expression, what, seconds=60):
        deadline = time.time() + seconds
        while time.time() < deadline:
            try:
                if self.query(expression).get("data", {}).get("result"):
                    return
            except OSError:
                pass
            time.sleep(0.5)
        fail(f"Prometheus: {what} did not happen in {seconds} s")

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weft", default=os.path.join(ROOT, "target", "release", "weft"))
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="weft-monitoring-")
    promtool_checks(scratch)
    queries = dashboards()
    rules = open(RULES).read()
    node = Node(args.weft, scratch)
    prometheus = None
    try:
        node.cli("pool", "create", "p", "--device", os.path.join(scratch, "p.img"),
                 "--device-size", "256MiB")
        node.cli("volume", "create", "v1", "--pool", "p", "--size", "64MiB")
        node.cli("host", "add", "tester", "--nqn", HOST_NQN)
        node.cli("volume", "attach", "v1", "--host", "tester")
        exported = node.exported()
        named = set()
        for _, _, expression in queries:
            named |= metric_names(expression)
        named |= metric_names(rules)
        unknown = named - exported
        if unknown:
            fail(f"dashboards or rules name metrics weft does not export: {sorted(unknown)}")
        print(f"metrics: the dashboards and rules name {len(named)} of weft's {len(exported)}, all exported")

        prometheus = Prometheus(scratch, node.read_only)
        prometheus.wait_for('up{job="weft"} == 1', "a first scrape of the node")
        node.bench(3)
        prometheus.wait_for('rate(weft_node_ops_total[1m]) > 0', "I/O seen in the scrapes")
        empty = []
        for board, title, expression in queries:
            concrete = (expression.replace("$__rate_interval", "1m")
                        .replace("$instance", ".*").replace("$volume", ".*"))
            answer = prometheus.query(concrete)
            if answer.get("status") != "success":
                fail(f"{board}: {title}: {concrete}: {answer.get('error')}")
            if not answer["data"]["result"]:
                empty.append(f"{board}: {title}")
        missing = [f"{b}: {t}" for b, t, _ in queries if t in MUST_ANSWER and f"{b}: {t}" in empty]
        if missing:
            fail(f"no data behind {missing}")
        print(f"dashboards: {len(queries)} queries valid in Prometheus, "
              f"{len(queries) - len(empty)} with data now (empty, as nothing happened: {len(empty)})")
        deadline = time.time() + 30
        while True:
            groups = prometheus.get("rules")["data"]["groups"]
            evaluated = all(not r["lastEvaluation"].startswith("0001")
                            for g in groups for r in g["rules"])
            if evaluated or time.time() > deadline:
                break
            time.sleep(0.5)
        broken = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"]
                  if r.get("health") != "ok"]
        if broken:
            fail(f"rules that do not evaluate: {broken}")
        # Pending included: the rules wait minutes before firing, longer than this runs.
        raised = prometheus.query("ALERTS")["data"]["result"]
        if raised:
            fail(f"alerts raised on a healthy node: {[a['metric'] for a in raised]}")
        print(f"rules: {sum(len(g['rules']) for g in groups)} evaluated by Prometheus, none pending or firing")
    finally:
        if prometheus:
            prometheus.stop()
        node.stop()
    shutil.rmtree(scratch, ignore_errors=True)
    print("check-monitoring: PASS")


if __name__ == "__main__":
    main()
