#!/usr/bin/python3
"""The web dashboard in a real browser: headless Chromium (Debian's
chromium and chromium-driver, driven by Selenium) against a real
`weft serve` with a pool, hosts and many volumes. Checks that the page
loads without console errors, refuses a wrong token, shows what the API
has (volumes, pools, hosts, I/O in the charts), picks up a volume created
meanwhile and lists it among its events, is usable from the keyboard and
fits a 1280x800 and a phone-sized window; that a read-only token sees no
actions and an admin token acts (creates, resizes, attaches, snapshots,
clones, detaches and deletes, each destructive step asked first, a refusal
shown in the API's words); measures how long the page takes to show every
volume, how long a change takes to appear, and the node's CPU with the
page open and with nobody looking. Screenshots go to --out.

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
from selenium.webdriver.support.ui import Select
from selenium.common.exceptions import StaleElementReferenceException

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


# The browser, once started: what its page said goes with a failure.
DRIVER = []


def what_the_page_said():
    try:
        said = DRIVER[0].execute_script(
            "return [...document.querySelectorAll('.said, #status')].map((e) => e.textContent).filter(Boolean)")
        events = DRIVER[0].execute_script(
            "return [...document.querySelectorAll('#event-list li')].slice(0, 8).map((e) => e.textContent)")
        return f" (the page says: {said}; its last events: {events})"
    except Exception:
        return ""


def wait(what, check, seconds=20):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if check():
                return
        except Exception:  # the page may be between renders
            pass
        time.sleep(0.05)
    fail(f"the page did not show {what} within {seconds} s{what_the_page_said() if DRIVER else ''}")


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


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_percent(pid, seconds):
    """The process's CPU over the next `seconds`, in percent of one core."""
    before, started = cpu_seconds(pid), time.time()
    time.sleep(seconds)
    return 100 * (cpu_seconds(pid) - before) / (time.time() - started)


def click(driver, find):
    """Clicks what `find` (an element, or a function finding it) gives; found
    again if the page re-rendered it meanwhile."""
    for attempt in range(10):
        element = find() if callable(find) else find
        try:
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
            element.click()
            return
        except StaleElementReferenceException:
            if not callable(find) or attempt == 9:
                raise
            time.sleep(0.05)


def volume_button(driver, name):
    return lambda: driver.find_element(
        By.XPATH, f"//table[@id='volume-table']//button[normalize-space()='{name}']")


def set_value(driver, element_id, text):
    field = driver.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(text)


def submit(driver, form_id):
    click(driver, driver.find_element(By.CSS_SELECTOR, f"#{form_id} button[type=submit]"))


def confirm(driver, answer):
    """Answers the page's question: 'yes' or 'cancel'; returns its text."""
    wait("a question before destroying", lambda: driver.find_element(By.ID, "confirm-dialog").is_displayed())
    text = driver.find_element(By.ID, "confirm-text").text
    driver.find_element(By.ID, f"confirm-{answer}").click()
    return text


def volume_or_none(node, name):
    return next((v for v in node.call("GET", "volumes") if v["name"] == name), None)


def act_as_admin(driver, node, out):
    """Signs in with the admin token and acts from the page; checks each
    action with the API (and the CLI) and a refusal in the API's words."""
    driver.find_element(By.ID, "sign-out").click()
    wait("the sign-in form", lambda: driver.find_element(By.ID, "token").is_displayed())
    driver.find_element(By.ID, "token").send_keys(node.admin, Keys.ENTER)
    wait("the actions of an admin token", lambda: driver.find_element(By.ID, "new-volume").is_displayed())
    click(driver, driver.find_element(By.CSS_SELECTOR, "#new-volume summary"))
    set_value(driver, "new-name", "ui-made")
    set_value(driver, "new-size", "2GiB")
    submit(driver, "new-volume-form")
    wait("the created volume's answer", lambda: page_has(driver, "#new-volume-error", "Volume ui-made created"))
    if "ui-made" not in node.cli("volume", "list"):
        fail("a volume created in the page is not in `weft volume list`")
    wait("the created volume in the list", volume_button(driver, "ui-made"))
    # Refusals in the API's words: a name taken, a size that is none.
    set_value(driver, "new-name", "ui-made")
    set_value(driver, "new-size", "1GiB")
    submit(driver, "new-volume-form")
    wait("the API's refusal of a name taken",
         lambda: page_has(driver, "#new-volume-error", "already exists"))
    set_value(driver, "new-size", "lots")
    submit(driver, "new-volume-form")
    wait("a size refused", lambda: page_has(driver, "#new-volume-error", "is not a size"))

    click(driver, volume_button(driver, "ui-made"))
    wait("the volume's dialog", lambda: driver.find_element(By.ID, "volume-dialog").is_displayed())
    set_value(driver, "resize-size", "3GiB")
    submit(driver, "resize-form")
    wait("the resize", lambda: volume_or_none(node, "ui-made")["size_bytes"] == 3 << 30)
    wait("the new size in the dialog", lambda: page_has(driver, "#volume-facts", "3.0 GiB"))
    Select(driver.find_element(By.ID, "attach-host")).select_by_value("web1")
    submit(driver, "attach-form")
    wait("the attachment", lambda: "web1" in volume_or_none(node, "ui-made")["hosts"])
    wait("the host in the dialog", lambda: page_has(driver, "#volume-hosts", "web1"))
    set_value(driver, "snapshot-name", "s1")
    submit(driver, "snapshot-form")
    wait("the snapshot", lambda: "s1" in volume_or_none(node, "ui-made")["snapshots"])
    wait("the clone form", lambda: driver.find_element(By.ID, "clone-form").is_displayed())
    set_value(driver, "clone-name", "ui-clone")
    submit(driver, "clone-form")
    wait("the clone", lambda: (volume_or_none(node, "ui-clone") or {}).get("origin") == "ui-made@s1")
    driver.save_screenshot(os.path.join(out, "volume-dialog-1280x800.png"))
    # Detaching asks first: Cancel keeps the host, yes detaches.
    detach = lambda: driver.find_element(By.XPATH, "//ul[@id='volume-hosts']//button[normalize-space()='Detach']")
    click(driver, detach)
    question = confirm(driver, "cancel")
    if "web1" not in question:
        fail(f"the question does not name the host: {question!r}")
    time.sleep(0.3)
    if "web1" not in volume_or_none(node, "ui-made")["hosts"]:
        fail("Cancel detached the host")
    click(driver, detach)
    driver.save_screenshot(os.path.join(out, "confirm-1280x800.png"))
    confirm(driver, "yes")
    wait("the detachment", lambda: volume_or_none(node, "ui-made")["hosts"] == [])
    driver.find_element(By.ID, "volume-close").click()

    # Deleting asks first: the clone goes; its origin is refused (in the
    # API's words) while it holds a snapshot, which goes first.
    delete = lambda: driver.find_element(By.ID, "delete-volume")
    for name in ("ui-clone", "ui-made"):
        click(driver, volume_button(driver, name))
        wait(f"{name}'s dialog", lambda: delete().is_displayed())
        click(driver, delete)
        question = confirm(driver, "yes")
        if name not in question:
            fail(f"the question does not name the volume: {question!r}")
        if name == "ui-made":
            wait("the refusal of a volume with snapshots",
                 lambda: page_has(driver, "#volume-error", "has snapshots"))
            click(driver, lambda: driver.find_element(
                By.XPATH, "//ul[@id='volume-snapshots']//button[normalize-space()='Delete']"))
            confirm(driver, "yes")
            wait("the snapshot deleted", lambda: volume_or_none(node, name)["snapshots"] == [])
            click(driver, delete)
            confirm(driver, "yes")
        wait(f"{name} deleted", lambda: volume_or_none(node, name) is None)
        wait(f"{name} gone from the page", lambda: not page_has(driver, "#volume-table", name))
    wait("the deletion in the events", lambda: page_has(driver, "#event-list", "volume ui-made deleted"))
    if "ui-made" in node.cli("volume", "list"):
        fail("a volume deleted in the page is still in `weft volume list`")


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
        DRIVER.append(driver)
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
        # A read-only token looks: no action is offered, a volume's dialog shows facts.
        if driver.find_element(By.ID, "new-volume").is_displayed():
            fail("a read-only token is offered to create volumes")
        click(driver, volume_button(driver, "vol0000"))
        wait("a volume's dialog", lambda: page_has(driver, "#volume-facts", "nqn.2026-11.io.weft:vol:vol0000"))
        if driver.find_element(By.ID, "delete-volume").is_displayed():
            fail("a read-only token is offered to delete a volume")
        driver.switch_to.active_element.send_keys(Keys.ESCAPE)
        wait("the dialog closed by Escape", lambda: not driver.find_element(By.ID, "volume-dialog").is_displayed())

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

        driver.set_window_size(1280, 800)
        act_as_admin(driver, node, args.out)
        # Refused calls are answered 409 and 400: the console shows those only.
        errors = console_errors(driver, expected=["status of 409", "status of 400"])
        if errors:
            fail(f"console errors while acting: {errors}")
        if "critical" in driver.find_element(By.ID, "status").get_attribute("class"):
            fail(f"the page says: {driver.find_element(By.ID, 'status').text}")
        looking_cpu = cpu_percent(node.process.pid, 10)
        driver.quit()
        driver = None
        idle_cpu = cpu_percent(node.process.pid, 10)
        print(f"the node's CPU: {looking_cpu:.2f}% of a core with the page open, {idle_cpu:.2f}% with nobody looking")
        if idle_cpu >= 1:
            fail(f"the node takes {idle_cpu:.2f}% of a core with nobody looking (goal: under 1%)")
        if update_s > 0.5:
            print(f"check-ui: NOTE a change took {update_s:.2f} s to land (goal 0.5 s)")
        # The dashboard's files are served with a strict policy.
        with urllib.request.urlopen(f"http://{API}/ui/") as response:
            policy = response.headers["Content-Security-Policy"]
            if "script-src 'self'" not in policy or "frame-ancestors 'none'" not in policy:
                fail(f"policy: {policy}")
        figures = {"volumes": args.volumes, "render_s": round(render_s, 3),
                   "update_s": round(update_s, 3),
                   "node_cpu_percent_page_open": round(looking_cpu, 2),
                   "node_cpu_percent_nobody_looking": round(idle_cpu, 2)}
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
