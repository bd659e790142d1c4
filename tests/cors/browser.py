#!/usr/bin/env python3
"""A kiosk page on another origin drives the service in headless Chromium.

Driven by tests/cors/run.sh, which starts the service with
CORS_ALLOWED_ORIGINS naming ALLOWED_ORIGIN, serves kiosk.html on that origin
and on OTHER_ORIGIN (another port: another origin), and sets TB_URL,
TB_ACCOUNT_ID, TB_KIOSK_KEY, TB_ADMIN_KEY. From the allowed origin the whole
flow must work, with the exposed headers readable and the guest action
charged once; from the other origin the browser must refuse the page every
answer and nothing may be charged. Every wait polls a condition.
"""

import json
import os
import sys
import urllib.parse
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

TB_URL = os.environ["TB_URL"].rstrip("/")
ACCOUNT = os.environ["TB_ACCOUNT_ID"]
KIOSK_KEY = os.environ["TB_KIOSK_KEY"]
ADMIN_KEY = os.environ["TB_ADMIN_KEY"]
ALLOWED = os.environ["ALLOWED_ORIGIN"]
OTHER = os.environ["OTHER_ORIGIN"]


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def account():
    request = urllib.request.Request(f"{TB_URL}/v1/accounts/{ACCOUNT}")
    request.add_header("Authorization", f"Bearer {ADMIN_KEY}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def start_browser():
    options = webdriver.ChromeOptions()
    options.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1024,768"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    return webdriver.Chrome(service=service, options=options)


def run_page(driver, origin):
    fragment = urllib.parse.urlencode({"api": TB_URL, "account": ACCOUNT, "key": KIOSK_KEY})
    driver.get(f"{origin}/kiosk.html#{fragment}")
    WebDriverWait(driver, 60, poll_frequency=0.1).until(
        lambda d: d.find_element(By.ID, "status").text in ("done", "blocked"))
    status = driver.find_element(By.ID, "status").text
    result = json.loads(driver.find_element(By.ID, "result").text)
    return status, result


def main():
    before = account()
    driver = start_browser()
    try:
        status, result = run_page(driver, ALLOWED)
        print(f"cors: from {ALLOWED}: {status} {json.dumps(result)}")
        check(status == "done", f"the allowed origin's flow did not finish: {result}")
        check(result["origin"] == ALLOWED, result)
        check(result["first_status"] == 201, result)
        check(result["location"], "Location is not exposed")
        check(result["request_id_header"], "X-Request-Id is not exposed")
        check(result["retry_status"] == 200 and result["replayed"] == "true",
              f"the retry must be a replay with a readable Idempotent-Replayed: {result}")
        check(result["job_status"] == "succeeded", result)
        check(result["available_before"] - result["available_after"] == result["cost"] == 1,
              f"charged once: {result}")
        check(result["etag"], "ETag is not exposed")
        check(result["refusal_status"] == 404 and result["refusal_code"] == "not_found", result)
        middle = account()
        check(before["available"] - middle["available"] == 1, (before, middle))

        status, result = run_page(driver, OTHER)
        print(f"cors: from {OTHER}: {status} {json.dumps(result)}")
        check(status == "blocked", f"a page of another origin read an answer: {result}")
        check(result["origin"] == OTHER, result)
        check("TypeError" in result["error"], result)
        console = " ".join(entry["message"] for entry in driver.get_log("browser"))
        check("CORS policy" in console, f"Chromium did not report a CORS refusal: {console}")
        after = account()
        check(after["available"] == middle["available"] and after["reserved"] == 0,
              f"the refused page spent tokens: {middle} → {after}")
    finally:
        driver.quit()
    print("cors: ok (the allowed origin ran the kiosk flow, the other was refused)")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as error:
        print(f"cors: FAILED: {error}", file=sys.stderr)
        sys.exit(1)
