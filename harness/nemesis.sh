#!/bin/bash
# The nemesis against the real processes (crates/weft/tests/nemesis.rs): etcd
# (three members), three `weft serve` nodes behind proxies that can cut any pair,
# and a host writing two replicated volumes with a history of every write, while
# faults are injected at random: kill -9, SIGSTOP, partitions (node-etcd,
# node-node, host-node, a node isolated), etcd members lost, two of three nodes
# down, every node restarted, a node killed again while it catches up. After
# each phase it heals, waits until the cluster converges, and reads every block
# back. Prints a table (faults by kind, writes acknowledged and verified, lost:
# must be 0, time to converge) and writes it as JSON.
#
# Usage: harness/nemesis.sh [--minutes N | --seconds N] [--seed S] [--json FILE]
#   default: 5 minutes, a seed from the clock, JSON to .cache/nemesis/last.json.
# A failing run names its seed (WEFT_NEMESIS_SEED replays the fault schedule)
# and keeps the processes' logs.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=300
seed=
json=.cache/nemesis/last.json
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) seconds=$(($2 * 60)); shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --json) json=$2; shift 2 ;;
        *) echo "usage: harness/nemesis.sh [--minutes N | --seconds N] [--seed S] [--json FILE]" >&2; exit 2 ;;
    esac
done
harness/deps.sh >/dev/null
mkdir -p "$(dirname "$json")"
json=$(realpath "$json")  # the test runs in its crate's directory
export WEFT_NEMESIS_SECONDS=$seconds WEFT_NEMESIS_JSON=$json
[ -n "$seed" ] && export WEFT_NEMESIS_SEED=$seed
cargo test --locked -p weft --test nemesis -- --ignored --nocapture 2>&1 | grep --line-buffered -v '^$'
echo "nemesis: report in $json"
