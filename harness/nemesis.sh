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
#                           [--upgrade-from COMMIT]
#   default: 5 minutes, a seed from the clock, JSON to .cache/nemesis/last.json.
#   --upgrade-from: the nodes start on weft built from COMMIT (built once, kept
#   under .cache/nemesis/) and the first phase upgrades them to this build one
#   by one (SIGTERM, start on this build, converge) under the writer.
# A failing run names its seed (WEFT_NEMESIS_SEED replays the fault schedule)
# and keeps the processes' logs.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=300
seed=
json=.cache/nemesis/last.json
from=
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) seconds=$(($2 * 60)); shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --json) json=$2; shift 2 ;;
        --upgrade-from) from=$2; shift 2 ;;
        *) echo "usage: harness/nemesis.sh [--minutes N | --seconds N] [--seed S] [--json FILE] [--upgrade-from COMMIT]" >&2; exit 2 ;;
    esac
done
harness/deps.sh >/dev/null
mkdir -p "$(dirname "$json")"
json=$(realpath "$json")  # the test runs in its crate's directory
export WEFT_NEMESIS_SECONDS=$seconds WEFT_NEMESIS_JSON=$json
[ -n "$seed" ] && export WEFT_NEMESIS_SEED=$seed
if [ -n "$from" ]; then
    commit=$(git rev-parse --verify "$from^{commit}")
    old=.cache/nemesis/weft-$commit
    if [ ! -x "$old" ]; then
        echo "nemesis: building weft at $commit (the version upgraded from)"
        src=.cache/nemesis/src-$commit
        rm -rf "$src" && mkdir -p "$src"
        git archive "$commit" | tar -x -C "$src"
        (cd "$src" && CARGO_TARGET_DIR="$PWD/../target-old" cargo build --release --locked -p weft --bin weft)
        cp .cache/nemesis/target-old/release/weft "$old"
        rm -rf "$src"
    fi
    export WEFT_NEMESIS_UPGRADE_FROM=$(realpath "$old")
fi
cargo test --locked --workspace --test nemesis -- --ignored --nocapture 2>&1 | grep --line-buffered -v '^$'
echo "nemesis: report in $json"
