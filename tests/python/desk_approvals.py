"""People deciding held actions at the review desk, in a real headless Chromium
(selenium + chromedriver, like desk_browser.py).

Run by tests/tests/it/approvals_desk.rs against a real gateway and fleet, with payments
held by an approval rule. Environment:
  DESK_URL              http://127.0.0.1:PORT (the gateway's API listener)
  DESK_APPROVER         token of "alice" (approve = true)
  DESK_SECOND_APPROVER  token of "carol" (approve = true): the second pair of eyes
  DESK_VIEWER           token of "victor" (no approve right)
  DESK_REQUESTER        token of "t0" (approve = true, but the id of the agent that asked)
  DESK_KEY_APPROVE      a held payment to approve (one approval needed)
  DESK_KEY_REJECT       a held payment to reject
  DESK_KEY_FOUR_EYES    a held payment that needs two different approvers
  DESK_SHOTS            directory for the screenshots
Prints one line per step; exits non-zero (with the step named) on any failure.
"""

import json
import os
import sys

import httpx
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

URL = os.environ["DESK_URL"].rstrip("/")
APPROVER = os.environ["DESK_APPROVER"]
SECOND = os.environ["DESK_SECOND_APPROVER"]
VIEWER = os.environ["DESK_VIEWER"]
REQUESTER = os.environ["DESK_REQUESTER"]
KEY_APPROVE = os.environ["DESK_KEY_APPROVE"]
KEY_REJECT = os.environ["DESK_KEY_REJECT"]
KEY_FOUR_EYES = os.environ["DESK_KEY_FOUR_EYES"]
SHOTS = os.environ["DESK_SHOTS"]
DESKTOP = (1280, 900)
PHONE = (390, 844)

DRIVER = None


def step(msg):
    print(f"step: {msg}", flush=True)


def check(cond, msg):
    if not cond:
        print(f"FAIL: {msg}", flush=True)
        if DRIVER is not None:
            print(f"at {DRIVER.current_url}:\n{DRIVER.page_source[:3000]}", flush=True)
        sys.exit(1)


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("DESK_CHROMIUM", "/usr/bin/chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              f"--window-size={DESKTOP[0]},{DESKTOP[1]}"):
        opts.add_argument(a)
    service = Service(executable_path=os.environ.get("DESK_CHROMEDRIVER", "/usr/bin/chromedriver"))
    d = webdriver.Chrome(service=service, options=opts)
    d.set_page_load_timeout(30)
    return d


def text(d, css):
    found = d.find_elements(By.CSS_SELECTOR, css)
    return found[0].text if found else None


def sign_in(d, token):
    d.get(f"{URL}/desk/reviews")
    check(d.current_url.endswith("/desk/login"), f"not signed in: sent to the sign-in page, got {d.current_url}")
    d.find_element(By.ID, "token").send_keys(token)
    d.find_element(By.ID, "sign-in").click()
    WebDriverWait(d, 10).until(lambda d: d.current_url.endswith("/desk/reviews"))


def sign_out(d):
    d.find_element(By.CSS_SELECTOR, "form.who button").click()
    WebDriverWait(d, 10).until(lambda d: d.current_url.endswith("/desk/login"))


def csrf(d):
    return d.find_element(By.CSS_SELECTOR, "form.who input[name=csrf]").get_attribute("value")


def shot(d, name, size=DESKTOP):
    d.set_window_size(*size)
    height = d.execute_script("return document.documentElement.scrollHeight")
    d.set_window_size(size[0], max(size[1], min(height + 120, 4000)))
    path = os.path.join(SHOTS, name)
    check(d.save_screenshot(path), f"screenshot {path}")
    d.set_window_size(*size)
    step(f"screenshot {path}")


def fits_the_screen(d, what):
    over = d.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
    check(over <= 0, f"{what}: {over}px wider than a {PHONE[0]}px phone screen")


def post_form(d, action, fields):
    """Submit a form the page does not offer (what a crafted request would send)."""
    d.execute_script(
        """const f = document.createElement('form'); f.method = 'post'; f.action = arguments[0];
           for (const [k, v] of Object.entries(arguments[1])) {
             const i = document.createElement('input'); i.type = 'hidden'; i.name = k; i.value = v; f.appendChild(i); }
           document.body.appendChild(f); f.submit();""",
        action, fields)
    WebDriverWait(d, 10).until(lambda d: d.find_elements(By.ID, "message-title") or d.find_elements(By.ID, "error"))


def open_held(d, key):
    d.get(f"{URL}/desk/approvals/{key}")
    WebDriverWait(d, 10).until(lambda d: d.find_elements(By.ID, "status"))


def decide(d, button, note=None):
    if note is not None:
        n = d.find_element(By.ID, "note")
        n.clear()
        n.send_keys(note)
    d.find_element(By.ID, button).click()
    WebDriverWait(d, 10).until(
        lambda d: d.find_elements(By.ID, "decided") or d.find_elements(By.ID, "message-title")
        or d.find_elements(By.ID, "error"))


def main():
    global DRIVER
    os.makedirs(SHOTS, exist_ok=True)
    d = DRIVER = browser()
    try:
        # A reviewer without the approve right: the list and the facts, no payload, no
        # buttons; a crafted decision is refused.
        sign_in(d, VIEWER)
        d.find_element(By.ID, "nav-approvals").click()
        WebDriverWait(d, 10).until(lambda d: d.find_elements(By.ID, "held-count"))
        keys = [a.get_attribute("data-key") for a in d.find_elements(By.CSS_SELECTOR, "a.held-link")]
        check(all(k in keys for k in (KEY_APPROVE, KEY_REJECT, KEY_FOUR_EYES)), f"all three held: {keys}")
        check(d.find_elements(By.ID, "view-only"), "the list says the viewer may not approve")
        open_held(d, KEY_APPROVE)
        check(text(d, "#status") == "awaiting_approval", "held")
        check(text(d, "#rule") == "large-payments", "the rule that held it")
        check(not d.find_elements(By.ID, "payload"), "no payload for a viewer")
        check("250000" not in d.page_source, "the amount appears nowhere on the viewer's page")
        check(not d.find_elements(By.ID, "approve") and not d.find_elements(By.ID, "reject"), "no buttons")
        check("approve right" in (text(d, "#cannot-decide") or ""), "the page says why")
        post_form(d, f"/desk/approvals/{KEY_APPROVE}/decide",
                  {"csrf": csrf(d), "decision": "approve", "note": "viewer tries anyway"})
        check(text(d, "#message-title") == "Not allowed", f"a viewer's approval is refused: {d.page_source[:400]}")
        step("a viewer sees held actions without payload or buttons; a forged approval is refused")
        sign_out(d)

        # The requester (a reviewer with the agent token's id) may not approve.
        sign_in(d, REQUESTER)
        open_held(d, KEY_FOUR_EYES)
        decide(d, "approve")
        check(text(d, "#message-title") == "Refused: your own request", f"own request: {d.page_source[:400]}")
        step("whoever asked may not approve")
        sign_out(d)

        # The approver: the list, the payload, the buttons.
        sign_in(d, APPROVER)
        check(text(d, "#signed-in-as").startswith("alice"), "signed in as alice")
        d.find_element(By.ID, "nav-approvals").click()
        WebDriverWait(d, 10).until(lambda d: d.find_elements(By.ID, "held-count"))
        check(not d.find_elements(By.ID, "view-only"), "an approver may approve")
        shot(d, "approvals-list.png")
        d.set_window_size(*PHONE)
        fits_the_screen(d, "the held list")
        d.set_window_size(*DESKTOP)
        d.find_element(By.CSS_SELECTOR, f"a.held-link[data-key='{KEY_APPROVE}']").click()
        WebDriverWait(d, 10).until(lambda d: d.find_elements(By.ID, "payload"))
        payload = json.loads(text(d, "#payload"))
        check(payload.get("amount_minor") == 250000 and payload.get("currency") == "EUR",
              f"the (sealed) payload, opened: {payload}")
        check(text(d, "#approvals").startswith("0 / 1"), f"no approvals yet: {text(d, '#approvals')}")
        check(text(d, "#requested-by") == "t0", "who asked")
        shot(d, "approvals-detail.png")
        d.set_window_size(*PHONE)
        fits_the_screen(d, "the held page")
        d.set_window_size(*DESKTOP)
        step("an approver sees what it would send")

        # Forged posts: no CSRF token, another site.
        cookies = {c["name"]: c["value"] for c in d.get_cookies()}
        with httpx.Client(base_url=URL, cookies=cookies, follow_redirects=False) as c:
            r = c.post(f"/desk/approvals/{KEY_APPROVE}/decide", data={"decision": "approve", "csrf": "00" * 32})
            check(r.status_code == 403 and "CSRF" in r.text, f"a wrong CSRF token: {r.status_code}")
            r = c.post(f"/desk/approvals/{KEY_APPROVE}/decide", data={"decision": "approve", "csrf": csrf(d)},
                       headers={"Origin": "https://evil.example"})
            check(r.status_code == 403 and "another site" in r.text, f"a post from another site: {r.status_code}")
        step("posts without the CSRF token or from another site are refused")

        # Approve: due for a worker now.
        decide(d, "approve")
        check(text(d, "#decided").startswith("Approved"), f"approved: {text(d, '#decided')}")
        check(text(d, "#status") in ("deferred", "executing", "succeeded"), f"released: {text(d, '#status')}")
        check(not d.find_elements(By.ID, "approve"), "nothing left to decide")
        check(not d.find_elements(By.ID, "payload"), "no payload once it is not held")
        shot(d, "approvals-approved.png")
        step("approved in the browser")

        # Reject: a note is required.
        open_held(d, KEY_REJECT)
        decide(d, "reject")
        check("note is required" in (text(d, "#error") or ""), "a rejection without a note is refused")
        check(text(d, "#status") == "awaiting_approval", "still held after the refusal")
        decide(d, "reject", "No invoice-2 in the ledger")
        check(text(d, "#decided").startswith("Rejected"), f"rejected: {text(d, '#decided')}")
        check(text(d, "#status") == "rejected", "rejected: never sent")
        step("rejected in the browser (with a note)")
        post_form(d, f"/desk/approvals/{KEY_REJECT}/decide", {"csrf": csrf(d), "decision": "approve"})
        check(text(d, "#message-title") == "Refused: not held", "a decided action is not held any more")
        step("deciding it again is refused: not held")

        # Four eyes: alice's approval is recorded, the action stays held; her second is
        # refused.
        open_held(d, KEY_FOUR_EYES)
        check(text(d, "#approvals").startswith("0 / 2"), f"two needed: {text(d, '#approvals')}")
        decide(d, "approve")
        check("1 more person" in (text(d, "#decided") or ""), f"one more needed: {text(d, '#decided')}")
        check(text(d, "#status") == "awaiting_approval", "still held after one approval")
        check(text(d, "#approvals").startswith("1 / 2"), f"one of two: {text(d, '#approvals')}")
        decide(d, "approve")
        check(text(d, "#message-title") == "Refused: already decided", f"the same person twice: {d.page_source[:400]}")
        step("four eyes: one approval recorded, the same person again refused")
        sign_out(d)

        # The second person releases it.
        sign_in(d, SECOND)
        open_held(d, KEY_FOUR_EYES)
        check(d.find_elements(By.ID, "payload"), "the second approver sees the payload")
        decide(d, "approve", "Second pair of eyes")
        check(text(d, "#decided").startswith("Approved"), f"approved by two: {text(d, '#decided')}")
        check(text(d, "#status") in ("deferred", "executing", "succeeded"), f"released: {text(d, '#status')}")
        step("four eyes: the second person's approval releases it")
        print(json.dumps({"ok": True}), flush=True)
    finally:
        d.quit()


if __name__ == "__main__":
    main()
