#!/usr/bin/env python3
"""`cargo test --workspace`, with its test binaries run side by side.

cargo runs one test binary after another, and many of weft's wait more than they
compute (leases, etcd, restarts): on CI's two cores `cargo test` kept about one core
busy. This script builds what `cargo test --workspace --locked` builds, then runs
the binaries JOBS at a time (each with its tests THREADS at a time), the slowest
first as the last run measured them (.cache/cargo-test-times.json), and the doc tests
beside them. Each binary runs as cargo runs it: from its package's directory, with
CARGO_MANIFEST_DIR and CARGO_PKG_NAME set. Its output is printed whole when it ends.

Usage: harness/cargo-test.py [--jobs 2] [--threads 2]
Exits non-zero, naming them, when any binary fails.
"""
import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMES = os.path.join(ROOT, ".cache", "cargo-test-times.json")
# Before any run is on record (a clean clone): the binaries that took longest when
# this was written, seconds with their tests run two at a time.
SLOWEST = {"weft-volume test model": 90, "weft test replication": 32, "weft test encryption": 30,
           "weft test erasure": 18, "weft test cluster": 17, "weft test qos": 12}


def test_binaries():
    """(name, executable, package dir, package name) of every test target cargo builds."""
    out = subprocess.run(
        ["cargo", "test", "--workspace", "--locked", "--no-run",
         "--message-format=json-render-diagnostics"],
        cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True).stdout
    found = []
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        target = msg["target"]
        package = package_name(msg["manifest_path"])
        name = "%s %s %s" % (package, target["kind"][0], target["name"])
        found.append((name, msg["executable"], os.path.dirname(msg["manifest_path"]), package))
    return found


def package_name(manifest_path):
    with open(manifest_path, "rb") as f:
        return tomllib.load(f)["package"]["name"]


def run(job, threads):
    name, exe, package_dir, package = job
    env = dict(os.environ, CARGO_MANIFEST_DIR=package_dir, CARGO_PKG_NAME=package)
    t0 = time.monotonic()
    cmd = ([exe, "--test-threads=%d" % threads] if exe
           else ["cargo", "test", "--workspace", "--locked", "--doc", "-q"])  # the doc tests
    proc = subprocess.run(cmd, cwd=package_dir, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    took = time.monotonic() - t0
    print("     Running %s (%s) [%.1f s]\n%s" % (name, exe or "cargo test --doc", took, proc.stdout),
          flush=True)
    return name, proc.returncode, took


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="test binaries at once")
    parser.add_argument("--threads", type=int, default=2, help="tests at once in each binary")
    args = parser.parse_args()
    jobs = test_binaries() + [("doc tests", None, ROOT, "")]
    try:
        with open(TIMES) as f:
            before = json.load(f)
    except (OSError, ValueError):
        before = SLOWEST
    jobs.sort(key=lambda j: -before.get(j[0], 0.0))
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda j: run(j, args.threads), jobs))
    os.makedirs(os.path.dirname(TIMES), exist_ok=True)
    with open(TIMES, "w") as f:
        json.dump({name: round(took, 1) for name, _, took in results}, f, indent=1, sort_keys=True)
    failed = [name for name, code, _ in results if code != 0]
    print("cargo-test: %d test binaries and the doc tests in %.0f s, %d at a time"
          % (len(jobs) - 1, time.monotonic() - t0, args.jobs))
    if failed:
        print("cargo-test: FAILED: %s" % ", ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
