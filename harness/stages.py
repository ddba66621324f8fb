#!/usr/bin/env python3
"""Where an I/O's time goes: runs one `weft bench --json` against a weft node
and reads the node's stage counters (GET /api/v1/stats, "stages") before and
after it, then prints, per I/O, the mean time in each stage, the host's
(from `weft bench`'s "host_stages") around the target's, and, by Little's
law (mean time x IOPS), how many of the host's I/Os were in that stage on
average; the round trip less the target's stages is the wire and the two
kernels' TCP stacks.

Usage: harness/stages.py --api http://127.0.0.1:PORT --token FILE [--label TEXT]
                         [--json OUT] -- WEFT bench ... --json
(the counters are node-wide: run nothing else against the node meanwhile; the
host's stages cover every pass of the run, so leave out --verify and --ramp)."""
import argparse
import json
import subprocess
import sys
import time
import urllib.request

# Stages in a command's order, with what each covers.
STAGES = [
    ("receive_to_start", "receive to start (parse, queue)"),
    ("service", "service (the device)"),
    ("reply_wait", "completed to send queued"),
    ("send", "send"),
]


def stats(api, token):
    request = urllib.request.Request(f"{api}/api/v1/stats",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.load(answer)["stages"]


def delta(before, after):
    """Per stage (commands, ns) and the loop counters, grown between the two."""
    stages = {}
    for old, new in zip(before["stages"], after["stages"]):
        stages[new["stage"]] = (new["commands"] - old["commands"], new["ns_total"] - old["ns_total"])
    counters = {k: after[k] - before[k] for k in ("wakeups", "sleeps", "receives", "sends")}
    return stages, counters


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", required=True)
    parser.add_argument("--token", required=True, help="the node's API token file")
    parser.add_argument("--label", default="")
    parser.add_argument("--json", help="write the breakdown here")
    parser.add_argument("bench", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
    token = open(args.token).read().strip()
    # Reactors publish every 250 ms tick: wait one out on each side.
    time.sleep(0.3)
    before = stats(args.api, token)
    if not before["stages"]:
        sys.exit("stages: this node reports no stage counts (a weft older than them?)")
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"stages: {' '.join(command)}: {done.stderr.strip()}")
    time.sleep(0.6)
    after = stats(args.api, token)
    job = json.loads(done.stdout)["jobs"][0]
    # Reads and writes together (the target's stages count both).
    sides = [job[d] for d in ("read", "write") if job[d]["iops"] > 0]
    iops = sum(side["iops"] for side in sides)
    host_us = sum(side["iops"] * side["lat_ns"]["mean"] for side in sides) / max(iops, 1) / 1000
    stages, counters = delta(before, after)
    ios = max(stages["service"][0], 1)
    rows = []
    for name, what in STAGES:
        commands, ns = stages[name]
        mean_us = ns / max(commands, 1) / 1000
        rows.append({"stage": name, "what": what, "mean_us": mean_us,
                     "in_it": mean_us * iops / 1e6})
    inside_us = sum(r["mean_us"] for r in rows)
    host = job.get("host_stages")
    if host:
        # The host's own stages around the round trip; the round trip less
        # the target's stages is the wire and both kernels' TCP stacks.
        around = [("host_queued", "host: submitted to sent", host["queued_us_mean"]),
                  ("wire", "wire and TCP stacks (round trip - target)",
                   host["round_trip_us_mean"] - inside_us),
                  ("host_reap", "host: received to reaped",
                   host_us - host["queued_us_mean"] - host["round_trip_us_mean"])]
    else:
        around = [("outside", "wire, TCP stacks and the host (the rest)", host_us - inside_us)]
    rows = [{"stage": s, "what": w, "mean_us": m, "in_it": m * iops / 1e6} for s, w, m in around[:1]] + rows \
        + [{"stage": s, "what": w, "mean_us": m, "in_it": m * iops / 1e6} for s, w, m in around[1:]]
    per_io = {k: v / ios for k, v in counters.items()}
    print(f"where the time goes{': ' + args.label if args.label else ''}"
          f" ({iops:,.0f} IOPS, host-side mean {host_us:.1f} us, {host_us * iops / 1e6:.1f} I/Os in flight)")
    print(f"  {'stage':<44} {'mean us':>9} {'I/Os in it':>11}")
    for row in rows:
        print(f"  {row['what']:<44} {row['mean_us']:>9.1f} {row['in_it']:>11.2f}")
    print("  per I/O: " + ", ".join(f"{k} {v:.2f}" for k, v in per_io.items()))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"label": args.label, "iops": iops, "host_mean_us": host_us,
                       "stages": rows, "per_io": per_io}, out, indent=1)


if __name__ == "__main__":
    main()
