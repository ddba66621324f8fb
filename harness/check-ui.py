#!/usr/bin/python3
"""The web dashboard in a real browser: headless Chromium (Debian's
chromium and chromium-driver, driven by Selenium) against a real
`weft serve` with a pool, hosts and many volumes. Checks that the page
loads without console errors, refuses a wrong token, shows what the API
has (volumes, pools, hosts, I/O in the charts), picks up a volume created
meanwhile and lists it among its events, is usable from the keyboard and
fits a 1280x800 and a phone-sized window; measures how long the page takes
to show every volume and how long a change takes to appear. Screenshots go
to --out.

Usage: harness/check-ui.py [--weft target/release/weft] [--volumes 1000] [--out DIR]
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVME, API = "127.0.0.1:14490", "127.0.0.1:14491"
HOST_NQN = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000a1e7"
# A name as hostile as an NQN may be: shown as text, never as markup.
HOSTILE_NQN = "nqn.2014-08.io.weft:<b>bold</b>\"'&amp;".replace("/", "")


def fail(message):
    sys.exit(f"check-ui: {message}")


class Node:
    def __init__(self, weft, directory):
        self.weft, data = weft, os.path.join(directory, "data")
        self.log = open(os.path.join(directory, "serve.log"), "w")
        self.process = subprocess.Popen(
            [weft, "serve", "--data-dir", data, "--listen", NVME, "--api-listen", API],
            stdout=self.log, stderr=self.log)
        deadline = time.time() + 30
        token = os.path.join(data, "api-token")
        while True:
            if os.path.exists(token):
                self.admin = open(token).read().strip()
                try:
                    self.call("GET", "pools")
                    break
                except OSError:
                    pass
            if time.time() > deadline or self.process.poll() is not None:
                fail(f"weft serve did not start (see {directory}/serve.log)")
            time.sleep(0.1)
        self.read_only = open(os.path.join(data, "api-token.read-only")).read().strip()

    def call(self, method, path, body=None):
        request = urllib.request.Request(
            f"http://{API}/api/v1/{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.admin}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)

    def cli(self, *args):
        env = dict(os.environ, WEFT_API=API, WEFT_API_TOKEN=self.admin)
        done = subprocess.run([self.weft, *args], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            fail(f"weft {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def wait(what, check, seconds=20):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if check():
                return
        except Exception:  # the page may be between renders
            pass
        time.sleep(0.05)
    fail(f"the page did not show {what} within {seconds} s")


def console_errors(driver, expected=()):
    """The browser's error entries since the last call, but those `expected`."""
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"
            and not any(text in entry["message"] for text in expected)]


def page_has(driver, selector, text):
    return driver.execute_script(
        "const e = document.querySelector(arguments[0]); return !!e && e.textContent.includes(arguments[1])",
        selector, text)


def rows(driver, selector):
    return driver.execute_script(
        "return document.querySelectorAll(arguments[0]).length", f"{selector} tbody tr")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weft", default=os.path.join(ROOT, "target", "release", "weft"))
    parser.add_argument("--volumes", type=int, default=1000)
    parser.add_argument("--out", default=os.path.join(ROOT, ".cache", "ui"))
    parser.add_argument("--json", help="write the measurements here")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="weft-ui-")
    node = Node(args.weft, scratch)
    driver = None
    try:
        node.cli("pool", "create", "fast", "--device", os.path.join(scratch, "fast.img"),
                 "--device-size", "4GiB")
        node.cli("host", "add", "web1", "--nqn", HOST_NQN)
        node.cli("host", "add", "odd", "--nqn", HOSTILE_NQN)
        started = time.time()
        for index in range(args.volumes):
            node.call("POST", "volumes",
                      {"name": f"vol{index:04}", "pool": "fast", "size_bytes": 1 << 30})
        node.cli("volume", "attach", "vol0000", "--host", "web1")
        print(f"{args.volumes} volumes created in {time.time() - started:.1f} s")

        driver = browser()
        driver.set_window_size(1280, 800)
        driver.get(f"http://{API}/")
        wait("the sign-in form", lambda: driver.find_element(By.ID, "token").is_displayed())
        token = driver.find_element(By.ID, "token")
        if driver.switch_to.active_element != token:
            fail("the token field does not have the focus at load")
        token.send_keys("not-a-token", Keys.ENTER)
        wait("a refusal of a wrong token",
             lambda: "refused" in driver.find_element(By.ID, "sign-in-error").text)
        # The refused call's 401 is the one error expected so far.
        errors = console_errors(driver, expected=["status of 401"])
        if errors:
            fail(f"console errors at load: {errors}")
        driver.find_element(By.ID, "token").send_keys(node.read_only, Keys.ENTER)
        signed_in = time.time()
        wait(f"{args.volumes} volumes", lambda: rows(driver, "#volume-table") == args.volumes)
        render_s = time.time() - signed_in
        print(f"every volume shown {render_s:.2f} s after signing in")
        text = driver.find_element(By.ID, "dashboard").text
        for expected in ("vol0000", "fast", "web1", HOST_NQN, HOSTILE_NQN, "single node"):
            if expected not in text:
                fail(f"the dashboard does not show {expected!r}")
        if driver.find_elements(By.CSS_SELECTOR, "#host-table b"):
            fail("a host's NQN became markup")
        driver.save_screenshot(os.path.join(args.out, "dashboard-1280x800.png"))

        # A change made elsewhere lands on the page, and in its events.
        node.cli("volume", "create", "fresh", "--pool", "fast", "--size", "1GiB")
        created = time.time()  # from the moment the API answered
        wait("a volume created meanwhile", lambda: page_has(driver, "#volume-table", "fresh"))
        update_s = time.time() - created
        wait("its event", lambda: page_has(driver, "#event-list", "volume fresh created"))
        print(f"a volume created by the CLI shown {update_s:.2f} s after it was, and in the events")

        # I/O reaches the charts.
        url = f"nvme-tcp://{NVME}/nqn.2026-11.io.weft:vol:vol0000"
        bench = subprocess.Popen([args.weft, "bench", "--target", url, "--hostnqn", HOST_NQN,
                                  "--rw", "randrw", "--runtime", "6s"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait("I/O in the charts, while it runs", lambda: page_has(driver, "#now-iops", "now:")
             and not page_has(driver, "#now-latency", "no I/O")
             and driver.find_elements(By.CSS_SELECTOR, "#chart-iops polyline"))
        if bench.wait(timeout=60) != 0:
            fail("weft bench failed")
        driver.find_element(By.CSS_SELECTOR, "a[href='#charts']").click()
        driver.save_screenshot(os.path.join(args.out, "charts-1280x800.png"))

        # Keyboard: Tab walks the navigation and the controls.
        driver.execute_script("window.scrollTo(0, 0); document.activeElement.blur()")
        reached = set()
        for _ in range(12):
            driver.switch_to.active_element.send_keys(Keys.TAB)
            active = driver.switch_to.active_element
            reached.add(active.get_attribute("id") or active.text)
        for _ in range(4):
            driver.switch_to.active_element.send_keys(Keys.TAB)
            active = driver.switch_to.active_element
            reached.add(active.get_attribute("id") or active.text)
        for wanted in ("Cluster", "Volumes", "Events", "sign-out", "volume-filter"):
            if wanted not in reached:
                fail(f"Tab does not reach {wanted!r} (reached {sorted(reached)})")
        # Enter on a link goes to its section; typing in the filter filters.
        driver.execute_script("document.activeElement.blur()")
        link = driver.find_element(By.CSS_SELECTOR, "a[href='#hosts']")
        link.send_keys(Keys.ENTER)
        if not driver.current_url.endswith("#hosts"):
            fail(f"Enter on the Hosts link went to {driver.current_url}")
        search = driver.find_element(By.ID, "volume-filter")
        search.send_keys("fresh")
        wait("the filter", lambda: rows(driver, "#volume-table") == 1)
        search.clear()
        search.send_keys(" ", Keys.BACKSPACE)

        # A phone-sized window: nothing wider than the screen but the tables' own scroll.
        driver.set_window_size(390, 844)
        time.sleep(0.5)
        overflow = driver.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
        if overflow > 0:
            fail(f"the page is {overflow} px wider than a phone's window")
        driver.save_screenshot(os.path.join(args.out, "dashboard-phone.png"))

        errors = console_errors(driver)
        if errors:
            fail(f"console errors: {errors}")
        if "critical" in driver.find_element(By.ID, "status").get_attribute("class"):
            fail(f"the page says: {driver.find_element(By.ID, 'status').text}")
        # The dashboard's files are served with a strict policy.
        with urllib.request.urlopen(f"http://{API}/ui/") as response:
            policy = response.headers["Content-Security-Policy"]
            if "script-src 'self'" not in policy or "frame-ancestors 'none'" not in policy:
                fail(f"policy: {policy}")
        figures = {"volumes": args.volumes, "render_s": round(render_s, 3),
                   "update_s": round(update_s, 3)}
        if args.json:
            with open(args.json, "w") as out:
                json.dump(figures, out, indent=2)
        print(f"check-ui: PASS {figures} (screenshots in {args.out})")
    finally:
        if driver:
            driver.quit()
        node.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
