#!/usr/bin/env python3
"""The TypeScript client as a web page uses it, in headless Chromium.

Driven by tests/typescript/run.sh: PAGE_ORIGIN serves clients/typescript
(its dist/ and browser.html), the service at TB_URL allows that origin
(CORS_ALLOWED_ORIGINS). Step 1 generates (charged once) and leaves one
request journaled in IndexedDB but never sent; the page is then loaded
again (a reload, as after a crash), and step 2 finds the entry, resume()
sends it: two jobs, each charged once, the journal all done.

Then the same page from an origin the service does not allow (the same
server by another name, http://127.0.0.1:<port> instead of
http://localhost:<port>): Kiosk.open rejects with CorsRefused, the page
shows a configuration error within 5 s, and the service has created
nothing (no job, no reservation, no ledger entry).
"""

import json
import os
import sys
import time
import urllib.parse
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

TB_URL = os.environ["TB_URL"]
ORIGIN = os.environ["PAGE_ORIGIN"]


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def step(driver, number):
    fragment = urllib.parse.urlencode({
        "step": number, "api": TB_URL,
        "account": os.environ["TB_ACCOUNT_ID"], "key": os.environ["TB_KIOSK_KEY"],
    })
    driver.get("about:blank")  # a new document for each step, as after a crash
    driver.get(f"{ORIGIN}/browser.html#{fragment}")
    WebDriverWait(driver, 60, poll_frequency=0.1).until(
        lambda d: d.find_element(By.ID, "status").text in ("done", "failed"))
    result = json.loads(driver.find_element(By.ID, "result").text)
    print(f"browser: step {number}: {json.dumps(result)}")
    check(driver.find_element(By.ID, "status").text == "done", f"step {number} failed: {result}")
    return result


def admin_get(path):
    request = urllib.request.Request(
        TB_URL + path, headers={"Authorization": f"Bearer {os.environ['TB_ADMIN_KEY']}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


def wrong_origin(driver):
    """The page from an origin not in CORS_ALLOWED_ORIGINS."""
    origin = ORIGIN.replace("//localhost:", "//127.0.0.1:")
    check(origin != ORIGIN, f"PAGE_ORIGIN {ORIGIN} is not on localhost")
    account = os.environ["TB_ACCOUNT_ID"]
    before = (admin_get(f"/v1/accounts/{account}/jobs?limit=500")["jobs"],
              admin_get(f"/v1/accounts/{account}/ledger?limit=1000")["entries"])
    fragment = urllib.parse.urlencode({
        "step": "cors", "api": TB_URL, "account": account, "key": os.environ["TB_KIOSK_KEY"],
    })
    driver.get("about:blank")
    started = time.monotonic()
    driver.get(f"{origin}/browser.html#{fragment}")
    WebDriverWait(driver, 60, poll_frequency=0.1).until(
        lambda d: d.find_element(By.ID, "status").text in ("done", "failed", "configuration error"))
    seen = time.monotonic() - started
    status = driver.find_element(By.ID, "status").text
    result = json.loads(driver.find_element(By.ID, "result").text)
    print(f"browser: wrong origin {origin}: {status!r} after {seen:.2f}s: {json.dumps(result)}")
    check(status == "configuration error", f"a refused origin was not named: {status} {result}")
    check(result["error"].startswith("CorsRefused: "), result)
    check(result["origin"] == origin, result)
    check(seen < 5.0, f"the configuration error took {seen:.2f}s (at most 5)")
    after = (admin_get(f"/v1/accounts/{account}/jobs?limit=500")["jobs"],
             admin_get(f"/v1/accounts/{account}/ledger?limit=1000")["entries"])
    check(after == before, "the refused page created something")


def main():
    options = webdriver.ChromeOptions()
    options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    driver = webdriver.Chrome(
        service=Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")), options=options)
    try:
        first = step(driver, 1)
        check(first["job"]["status"] == "succeeded", first)
        second = step(driver, 2)
        check(second["pending"] == [first["left"]], f"the journal lost the entry: {second}")
        check(second["resumed"] == [{"request_id": first["left"], "status": "succeeded", "error": None}],
              second)
        states = dict(second["history"])
        check(states == {first["job"]["request_id"]: "done", first["left"]: "done"}, second)
        check(second["balance"]["used"] == 2 and second["balance"]["reserved"] == 0, second)
        wrong_origin(driver)
    finally:
        driver.quit()
    print("browser: ok (IndexedDB journal: a guest action charged once, an unsent entry resumed "
          "after a reload; a refused origin named CorsRefused, nothing created)")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as error:
        print(f"browser: FAILED: {error}", file=sys.stderr)
        sys.exit(1)
