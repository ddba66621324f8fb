"""A real Ceph cluster on loopback, started by hand (no cephadm, no
containers) from Debian's packages: one monitor, one manager and three OSDs
(BlueStore on sparse files in the work directory), a replicated RBD pool of
size 3 (min_size 2) and an erasure-coded data pool of 2+1. What
harness/bench-peers.py measures weft against.

It runs Ceph with its defaults except what one machine needs: every OSD on
one host (CRUSH chooses OSDs, not hosts, and two OSDs reporting a third
one's silence count as two reporters, as OSDs of two hosts would: else a
frozen OSD is marked down only after mon_osd_report_timeout, 900 s), no cephx (weft's side runs in the
clear on loopback too), 1 GiB of memory per OSD, and librbd's client cache
off (fio measures the cluster, not a cache in the client).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

MON_PORT = 13300


def require():
    """Debian's Ceph (16.2 in bookworm), which harness/deps.sh installs."""
    missing = [tool for tool in ["ceph-mon", "ceph-mgr", "ceph-osd", "rbd"] if not shutil.which(tool)]
    if missing:
        sys.exit(f"ceph: {', '.join(missing)} not found; run harness/deps.sh (it installs"
                 " Debian's ceph-mon, ceph-mgr, ceph-osd and ceph-common)")


class Ceph:
    def __init__(self, work, osd_bytes):
        self.work = work
        self.osd_bytes = osd_bytes
        self.conf = os.path.join(work, "ceph.conf")
        self.env = dict(os.environ, CEPH_CONF=self.conf)
        # Known before any daemon starts: stop() after a failed start finds them.
        self.osds = []

    def config(self, fsid):
        w = self.work
        return f"""[global]
fsid = {fsid}
mon host = v2:127.0.0.1:{MON_PORT}
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
public addr = 127.0.0.1
ms bind ipv6 = false
run dir = {w}/run
log file = {w}/log/$name.log
admin socket = {w}/run/$name.asok
pid file = {w}/run/$name.pid
osd pool default size = 3
osd pool default min size = 2
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon osd reporter subtree level = osd
mon allow pool delete = true
mon warn on insecure global id reclaim allowed = false
osd objectstore = bluestore
osd memory target = 1073741824
bluestore block create = true
bluestore block size = {self.osd_bytes}
osd data = {w}/osd.$id
mon data = {w}/mon.$id
mgr data = {w}/mgr.$id
mon data avail warn = 1
mon data avail crit = 0
[client]
rbd cache = false
"""

    def run(self, *args, check=True):
        done = subprocess.run(list(args), env=self.env, capture_output=True, text=True)
        if check and done.returncode != 0:
            sys.exit(f"ceph: {' '.join(args)}: {done.stderr.strip()}; logs in {self.work}/log")
        return done.stdout

    def ceph(self, *args):
        return self.run("ceph", *args)

    def start(self, image_bytes):
        """Monitor, manager, three OSDs, pools `rbd` (size 3) and `ec`
        (2+1, its metadata in `rbd`), images `rep` and `ec` of
        `image_bytes`; returns once every placement group is active+clean."""
        shutil.rmtree(self.work, ignore_errors=True)
        for name in ["run", "log", "mon.a", "mgr.x"]:
            os.makedirs(os.path.join(self.work, name))
        fsid = str(uuid.uuid4())
        with open(self.conf, "w") as out:
            out.write(self.config(fsid))
        monmap, keyring = (os.path.join(self.work, f) for f in ("monmap", "keyring"))
        self.run("monmaptool", "--create", "--fsid", fsid, "--addv", "a",
                 f"[v2:127.0.0.1:{MON_PORT}]", monmap)
        self.run("ceph-authtool", "--create-keyring", keyring, "--gen-key", "-n", "mon.",
                 "--cap", "mon", "allow *")
        self.run("ceph-mon", "--mkfs", "-i", "a", "--monmap", monmap, "--keyring", keyring)
        self.run("ceph-mon", "-i", "a")
        self.run("ceph-mgr", "-i", "x")
        self.osds = []
        for _ in range(3):
            osd_uuid = str(uuid.uuid4())
            osd = self.ceph("osd", "new", osd_uuid).strip()
            os.makedirs(os.path.join(self.work, f"osd.{osd}"))
            self.run("ceph-osd", "-i", osd, "--mkfs", "--osd-uuid", osd_uuid)
            self.run("ceph-osd", "-i", osd)
            self.osds.append(osd)
        self.ceph("osd", "pool", "create", "rbd", "32", "32", "replicated")
        self.ceph("osd", "pool", "set", "rbd", "size", "3", "--yes-i-really-mean-it")
        self.ceph("osd", "pool", "set", "rbd", "min_size", "2")
        self.run("rbd", "pool", "init", "rbd")
        self.ceph("osd", "erasure-code-profile", "set", "k2m1", "k=2", "m=1",
                  "crush-failure-domain=osd")
        self.ceph("osd", "pool", "create", "ec", "32", "32", "erasure", "k2m1")
        self.ceph("osd", "pool", "set", "ec", "allow_ec_overwrites", "true")
        self.ceph("osd", "pool", "application", "enable", "ec", "rbd")
        size = f"{image_bytes >> 20}M"
        self.run("rbd", "create", "rbd/rep", "--size", size)
        self.run("rbd", "create", "rbd/ec", "--size", size, "--data-pool", "ec")
        self.wait_clean(120)

    def wait_clean(self, limit):
        """Seconds until every placement group is active+clean."""
        start = time.perf_counter()
        while time.perf_counter() - start < limit:
            status = json.loads(self.ceph("pg", "stat", "-f", "json"))
            states = status["pg_summary"]["num_pg_by_state"]
            total = status["pg_summary"]["num_pgs"]
            if total and all(s["name"] == "active+clean" for s in states):
                return time.perf_counter() - start
            time.sleep(0.2)
        sys.exit(f"ceph: placement groups not active+clean within {limit} s: {states}")

    def pid(self, name):
        try:
            return int(open(os.path.join(self.work, "run", f"{name}.pid")).read())
        except (OSError, ValueError):
            return None

    def daemons(self):
        return ["mon.a", "mgr.x"] + [f"osd.{osd}" for osd in self.osds]

    def pids(self):
        """Every daemon's process (None for one not running)."""
        return [self.pid(name) for name in self.daemons()]

    def primary_osd(self, image):
        """The OSD that is primary for the first object of `image`."""
        info = json.loads(self.run("rbd", "info", f"rbd/{image}", "--format", "json"))
        pool = "ec" if info.get("data_pool") == "ec" else "rbd"
        obj = info["block_name_prefix"] + ".0000000000000000"
        mapped = json.loads(self.ceph("osd", "map", pool, obj, "-f", "json"))
        return str(mapped["acting_primary"])

    def kill_osd(self, osd):
        pid = self.pid(f"osd.{osd}")
        os.kill(pid, signal.SIGKILL)
        while os.path.exists(f"/proc/{pid}"):
            time.sleep(0.01)

    def start_osd(self, osd):
        self.run("ceph-osd", "-i", osd)

    def recovered_bytes(self):
        """Bytes recovered so far, summed over the placement groups' statistics."""
        dump = json.loads(self.ceph("pg", "dump", "pgs", "-f", "json"))
        pgs = dump["pg_stats"] if isinstance(dump, dict) else dump
        return sum(pg["stat_sum"].get("num_bytes_recovered", 0) for pg in pgs)

    def version(self):
        return self.run("ceph", "--version").split("(")[0].strip()

    def stop(self):
        for pid in self.pids():
            if pid:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 20
        for pid in self.pids():
            while pid and os.path.exists(f"/proc/{pid}") and time.time() < deadline:
                time.sleep(0.1)
            if pid and os.path.exists(f"/proc/{pid}"):
                os.kill(pid, signal.SIGKILL)
        for name in os.listdir(self.work):
            if name.startswith("osd.") or name.startswith("mon."):
                shutil.rmtree(os.path.join(self.work, name), ignore_errors=True)
