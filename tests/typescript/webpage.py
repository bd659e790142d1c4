#!/usr/bin/env python3
"""clients/typescript/README.md's web-page recipe, as written, in headless
Chromium under the console's strict Content-Security-Policy.

Driven by tests/typescript/run.sh, which runs the README's install and
copy blocks in a fresh directory (WWW's parent) and writes its
www/index.html and www/booth.js there. This script writes www/booth.json
(the booth's settings, as the README says), serves www/ on WEB_ORIGIN with
the README's policy (its service origin replaced by TB_URL; checked to be
the console's own, src/routes/console.rs, plus that origin in
connect-src), opens the page, waits for "Press the button!", presses it and
waits for the picture. Then the service's books: one succeeded job,
charged once, nothing left reserved; and no policy violation, neither as
a `securitypolicyviolation` event (a listener CDP adds before the page's
own scripts) nor in the browser's console.

Needs TB_URL, TB_ADMIN_KEY, TB_ACCOUNT_ID, TB_KIOSK_KEY, WWW, WEB_ORIGIN.
"""

import functools
import http.server
import json
import os
import re
import sys
import threading
import time
import urllib.parse
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
README = os.path.join(ROOT, "clients", "typescript", "README.md")
EXAMPLE_SERVICE = "https://tb.example.com"


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def policies():
    """The README's policy for the example service, and the console's."""
    readme = open(README, encoding="utf-8").read()
    found = re.findall(r"^Content-Security-Policy: (.+)$", readme, re.M)
    check(len(found) == 1, f"the README has {len(found)} Content-Security-Policy lines")
    rust = open(os.path.join(ROOT, "src", "routes", "console.rs"), encoding="utf-8").read()
    constant = re.search(r'pub const CONTENT_SECURITY_POLICY: &str = "(.*?)";', rust, re.S).group(1)
    console = re.sub(r"\\\n\s*", "", constant)
    check(found[0].replace(f" {EXAMPLE_SERVICE}", "") == console,
          f"the README's policy is not the console's plus the service in connect-src:\n"
          f"  {found[0]}\n  {console}")
    return found[0], console


class Handler(http.server.SimpleHTTPRequestHandler):
    policy = ""

    def end_headers(self):
        self.send_header("Content-Security-Policy", self.policy)
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, *args):
        pass


def admin_get(path):
    request = urllib.request.Request(
        os.environ["TB_URL"] + path, headers={"Authorization": f"Bearer {os.environ['TB_ADMIN_KEY']}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


# Recorded before any script of the page runs; CDP's script is not subject
# to the page's policy.
LISTENER = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__violations.push(`${event.violatedDirective} ${event.blockedURI} ${event.sourceFile}:${event.lineNumber}`);
});
"""


def main():
    tb_url, www, origin = os.environ["TB_URL"], os.environ["WWW"], os.environ["WEB_ORIGIN"]
    account = os.environ["TB_ACCOUNT_ID"]
    readme_policy, _ = policies()
    service_origin = "{0.scheme}://{0.netloc}".format(urllib.parse.urlsplit(tb_url))
    Handler.policy = readme_policy.replace(EXAMPLE_SERVICE, service_origin)
    with open(os.path.join(www, "booth.json"), "w", encoding="utf-8") as settings:
        json.dump({"baseUrl": tb_url, "apiKey": os.environ["TB_KIOSK_KEY"], "accountId": account}, settings)
    port = urllib.parse.urlsplit(origin).port
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), functools.partial(Handler, directory=www))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with urllib.request.urlopen(f"{origin}/index.html", timeout=10) as answer:
        check(answer.headers["Content-Security-Policy"] == Handler.policy, "the page is served without the policy")

    options = webdriver.ChromeOptions()
    options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(
        service=Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")), options=options)
    try:
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": LISTENER})
        started = time.monotonic()
        driver.get(f"{origin}/index.html")
        screen = lambda d: d.find_element(By.ID, "screen").text  # noqa: E731
        WebDriverWait(driver, 30, poll_frequency=0.1).until(lambda d: screen(d) != "Starting …")
        check(screen(driver) == "Press the button!", f"the page did not start: {screen(driver)!r}")
        ready = time.monotonic() - started
        driver.find_element(By.ID, "press").click()
        WebDriverWait(driver, 60, poll_frequency=0.1).until(
            lambda d: not screen(d).startswith("Painting"))
        shown = screen(driver)
        print(f"webpage: ready after {ready:.2f}s; after the press: {shown!r}")
        check(shown.startswith("Here is your picture: "), f"the press did not make a picture: {shown!r}")
        violations = driver.execute_script("return window.__violations")
        console = [entry["message"] for entry in driver.get_log("browser")]
    finally:
        driver.quit()
        server.shutdown()
    refused = [line for line in console if "Content Security Policy" in line or "Refused to" in line]
    check(violations == [] and refused == [],
          f"policy violations: events {violations}, console {refused}")
    jobs = admin_get(f"/v1/accounts/{account}/jobs?limit=500")["jobs"]
    balance = admin_get(f"/v1/accounts/{account}")
    ledger = admin_get(f"/v1/accounts/{account}/ledger?limit=1000")["entries"]
    commits = [entry for entry in ledger if entry["kind"] == "commit"]
    check(len(jobs) == 1 and jobs[0]["status"] == "succeeded", f"jobs: {jobs}")
    check(len(commits) == 1 and balance["used"] == jobs[0]["cost"] and balance["reserved"] == 0,
          f"books: {balance}, commits {commits}")
    print(f"webpage: ok (the README's page under the console's policy: one job "
          f"{jobs[0]['request_id']}, charged {jobs[0]['cost']} once; 0 policy violations, "
          f"{len(console)} console lines: {console})")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as error:
        print(f"webpage: FAILED: {error}", file=sys.stderr)
        sys.exit(1)
