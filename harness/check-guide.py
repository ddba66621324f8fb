#!/usr/bin/env python3
"""Runs the user guide (README.md's tour and docs/guide/*.md), so that it cannot rot: each
chapter's ```sh blocks in order, in one bash session per chapter
(set -euo pipefail) in a scratch directory, with this build's `weft` first
on PATH; ```toml blocks starting `# file: NAME` are written to NAME first.
A chapter marked `<!-- guide-test: node -->` gets a `weft serve` (no
configuration) started in its directory before its first block. Blocks
marked `sh host` (the Linux host's nvme-cli) are checked against the guest
tests (each `nvme` subcommand shown must be one harness/guest/ runs);
`sh no-run` blocks are listed. Conventions: docs/guide/README.md.

Usage: harness/check-guide.py [--weft target/release/weft] [CHAPTER.md ...]
"""

import argparse
import glob
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(ROOT, "docs", "guide")
MODES = ("node", "self", "none")
# A chapter that runs longer hangs (a node that never came up, waited for).
CHAPTER_SECONDS = 300
# A chapter's node, as `weft serve` with no configuration listens.
API = "127.0.0.1:9440"
# What the chapters that start their own (etcd, three nodes) listen on.
SELF_PORTS = [2379, 2380, 4420, 4421, 4422, 9440, 9441, 9442]


def fail(message):
    sys.exit(f"check-guide: {message}")


def blocks(path):
    """(language, info, first line number, text) of each fenced block."""
    found, current = [], None
    for number, line in enumerate(open(path).read().split("\n"), 1):
        if current is None and re.match(r"\s+```|```(bash|shell|console)\b", line):
            fail(f"{path}:{number}: a block this harness would not run: write ```sh at the "
                 "line's start (or ```text for output)")
        if current is None and line.startswith("```"):
            words = line[3:].split()
            current = (words[0] if words else "", " ".join(words[1:]), number + 1, [])
        elif current is not None and line.startswith("```"):
            found.append((current[0], current[1], current[2], "\n".join(current[3])))
            current = None
        elif current is not None:
            current[3].append(line)
    if current is not None:
        fail(f"{path}:{current[2] - 1}: a block is never closed")
    return found


def mode_of(path):
    """The chapter's mode, and the chapter it goes on from (`after NAME`:
    that chapter's blocks run first, in the same directory)."""
    match = re.search(r"<!-- guide-test: (\w+)(?: after (\S+))? -->", open(path).read())
    if not match or match.group(1) not in MODES:
        fail(f"{path}: no <!-- guide-test: {'|'.join(MODES)} [after CHAPTER.md] --> line")
    return match.group(1), match.group(2)


def script(path, chapter_blocks):
    """The chapter's bash script: a marker before each block, which says
    where a failure came from."""
    parts = ["set -euo pipefail"]
    for language, info, line, text in chapter_blocks:
        if language == "sh" and not info:
            where = line if isinstance(line, str) else f"{os.path.basename(path)}:{line}"
            parts.append(f"echo '>>> {where}' >&2")
            parts.append(text)
        elif language == "toml" and text.startswith("# file: "):
            name = text.split("\n", 1)[0][len("# file: "):].strip()
            if name.startswith("/") or ".." in name.split("/"):
                fail(f"{path}:{line}: a file block must name a file in the chapter's directory")
            parts.append(f"cat > {shlex.quote(name)} <<'WEFT_GUIDE_EOF'\n{text}\nWEFT_GUIDE_EOF")
    return "\n".join(parts) + "\n"


def guest_nvme_subcommands():
    used = set()
    for path in glob.glob(os.path.join(ROOT, "harness", "guest", "*.sh")):
        used.update(re.findall(r"\bnvme ([a-z][a-z-]+)", open(path).read()))
    return used


def check_host_blocks(path, chapter_blocks, used):
    for language, info, line, text in chapter_blocks:
        if language != "sh" or info != "host":
            continue
        for subcommand in re.findall(r"^\s*nvme ([a-z][a-z-]+)", text, re.M):
            if subcommand not in used:
                fail(f"{path}:{line}: `nvme {subcommand}` is run by no guest test (harness/guest/)")


def busy(address):
    """Fails if something listens on `address` already (the chapter's node
    would not start, and its commands would reach the other)."""
    host, port = address.split(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
    except OSError:
        return
    fail(f"something listens on {address} already: stop it (the guide's chapters use it)")


def wait_for(address, process, log, seconds=30):
    host, port = address.split(":")
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            fail(f"weft serve ended at its start:\n{open(log).read()[-2000:]}")
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    fail(f"weft serve did not listen on {address}")


def run_chapter(path, weft, keep, verbose):
    chapter_blocks = blocks(path)
    mode, after = mode_of(path)
    runnable = [b for b in chapter_blocks if b[0] == "sh" and not b[1]]
    if after:
        before = os.path.join(os.path.dirname(path), after)
        chapter_blocks = [(language, info, line, text) if language != "sh" or info else
                          (language, info, f"{after}:{line}", text)
                          for language, info, line, text in blocks(before)] + chapter_blocks
    if mode == "none" and runnable:
        fail(f"{path}: marked guide-test: none, but has ```sh blocks to run")
    if not runnable:
        return 0
    work = tempfile.mkdtemp(prefix=f"weft-guide-{os.path.basename(path)[:2]}-")
    env = dict(os.environ, PATH=f"{os.path.dirname(os.path.abspath(weft))}:{os.environ['PATH']}")
    env.pop("WEFT_API", None)
    env.pop("WEFT_API_TOKEN", None)
    node = None
    groups = []
    try:
        for port in SELF_PORTS if mode == "self" else [9440, 4420]:
            busy(f"127.0.0.1:{port}")
        if mode == "node":
            log = os.path.join(work, "serve.log")
            node = subprocess.Popen([weft, "serve"],
                                    cwd=work, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                    start_new_session=True)
            groups.append(node)
            wait_for(API, node, log)
        started = time.time()
        # Its own process group: what its blocks start in the background
        # (etcd, nodes) is stopped with it.
        # Output to files, not pipes: what a block leaves running in the
        # background holds them open after bash ends.
        out, err = (open(os.path.join(work, f".guide.{n}"), "w+") for n in ("out", "err"))
        bash = subprocess.Popen(["bash", "-c", script(path, chapter_blocks)], cwd=work, env=env,
                                stdout=out, stderr=err, start_new_session=True)
        groups.append(bash)
        try:
            bash.wait(timeout=CHAPTER_SECONDS)
        except subprocess.TimeoutExpired:
            bash.kill()
            bash.wait()
        stdout, stderr = (open(f.name).read() for f in (out, err))
        if bash.returncode != 0:
            keep = True  # its logs tell why
            where = re.findall(r">>> (\S+)", stderr)
            print(stdout[-3000:])
            print(stderr[-3000:], file=sys.stderr)
            what = "timed out" if bash.returncode == -signal.SIGKILL else f"failed (exit {bash.returncode})"
            fail(f"the block at {where[-1] if where else path} {what}; its directory: {work}")
        if verbose:
            print(stdout)
        print(f"  {os.path.basename(path)}: {len(runnable)} blocks ran in {time.time() - started:.1f} s")
        return len(runnable)
    finally:
        cleanup(work, groups, keep)


def cleanup(work, groups, keep):
    """Stops every process group the chapter made (its leader and what its
    blocks left in the background), then removes its directory."""
    for process in groups:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for process in groups:
        try:
            process.wait(timeout=20)  # the leader reaped: no zombie answers for the group
        except subprocess.TimeoutExpired:
            pass
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                os.killpg(process.pid, 0)
                time.sleep(0.1)
            except ProcessLookupError:
                break
        else:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if not keep:
        shutil.rmtree(work, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weft", default=os.path.join(ROOT, "target", "release", "weft"))
    parser.add_argument("--keep", action="store_true", help="keep the scratch directories")
    parser.add_argument("--verbose", action="store_true", help="print what the blocks printed")
    parser.add_argument("chapters", nargs="*")
    args = parser.parse_args()
    chapters = args.chapters or [os.path.join(ROOT, "README.md")] + sorted(
        glob.glob(os.path.join(GUIDE, "[0-9][0-9]-*.md")))
    weft = os.path.abspath(args.weft)
    used = guest_nvme_subcommands()
    ran = host = unrun = 0
    # Every chapter checked before any runs.
    for path in chapters:
        chapter_blocks = blocks(path)
        _, after = mode_of(path)
        if after and not os.path.exists(os.path.join(os.path.dirname(path), after)):
            fail(f"{path}: goes on from {after}, which does not exist")
        check_host_blocks(path, chapter_blocks, used)
        host += sum(1 for b in chapter_blocks if b[0] == "sh" and b[1] == "host")
        for language, info, line, text in chapter_blocks:
            if language == "sh" and info == "no-run":
                unrun += 1
                print(f"  not run here: {os.path.basename(path)}:{line}")
            elif language == "sh" and info not in ("", "host", "no-run"):
                fail(f"{path}:{line}: unknown block kind 'sh {info}'")
    for path in chapters:
        ran += run_chapter(path, weft, args.keep, args.verbose)
    print(f"check-guide: PASS ({ran} blocks run, {host} host blocks checked against the guest "
          f"tests, {unrun} not run here, in {len(chapters)} chapters)")


if __name__ == "__main__":
    main()
