"""A person at the review desk, in a real headless Chromium (selenium + chromedriver).

Run by tests/tests/it/desk.rs against a real gateway, fleet and reviews made by a real
run. Environment:
  DESK_URL          http://127.0.0.1:PORT (the gateway's API listener)
  DESK_DECIDER      token of a reviewer with role "decide" (id "alice")
  DESK_VIEWER       token of a reviewer with role "view" (id "victor")
  DESK_OTHER_TENANT token of a "decide" reviewer of another tenant (id "gina")
  DESK_KEY_A        an open review to resolve as succeeded
  DESK_PROVIDER_ID  the provider's id to record for it
  DESK_KEY_B        an open review nobody may resolve here (refusals are tried on it)
  DESK_SHOTS        directory for the screenshots
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
DECIDER = os.environ["DESK_DECIDER"]
VIEWER = os.environ["DESK_VIEWER"]
OTHER_TENANT = os.environ["DESK_OTHER_TENANT"]
KEY_A = os.environ["DESK_KEY_A"]
PROVIDER_ID = os.environ["DESK_PROVIDER_ID"]
KEY_B = os.environ["DESK_KEY_B"]
SHOTS = os.environ["DESK_SHOTS"]
PHONE = (390, 844)
DESKTOP = (1280, 900)


def step(msg):
    print(f"step: {msg}", flush=True)


DRIVER = None


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


def fits_the_screen(d, what):
    """On a phone-wide window nothing may need sideways scrolling (tables scroll inside)."""
    over = d.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
    check(over <= 0, f"{what}: {over}px wider than a {PHONE[0]}px phone screen")


def shot(d, name, size):
    d.set_window_size(*size)
    height = d.execute_script("return document.documentElement.scrollHeight")
    d.set_window_size(size[0], max(size[1], min(height + 120, 4000)))
    path = os.path.join(SHOTS, name)
    check(d.save_screenshot(path), f"screenshot {path}")
    d.set_window_size(*size)
    step(f"screenshot {path}")


def post_form(d, action, fields):
    """Submit a form the page does not offer (what a crafted request would send)."""
    d.execute_script(
        """const f = document.createElement('form'); f.method = 'post'; f.action = arguments[0];
           for (const [k, v] of Object.entries(arguments[1])) {
             const i = document.createElement('input'); i.type = 'hidden'; i.name = k; i.value = v; f.appendChild(i); }
           document.body.appendChild(f); f.submit();""",
        action, fields)
    WebDriverWait(d, 10).until(lambda d: d.find_elements(By.ID, "message-title") or d.find_elements(By.ID, "error"))


def main():
    global DRIVER
    os.makedirs(SHOTS, exist_ok=True)
    d = DRIVER = browser()
    try:
        # A wrong token is refused.
        d.get(f"{URL}/desk/login")
        d.find_element(By.ID, "token").send_keys("not-a-reviewer")
        d.find_element(By.ID, "sign-in").click()
        WebDriverWait(d, 10).until(lambda d: d.find_elements(By.ID, "error"))
        check("not in the reviewers file" in (text(d, "#error") or ""), "a wrong token is refused")
        step("a wrong token is refused")

        # The viewer reads, but may not decide: no form, and a crafted post is refused.
        sign_in(d, VIEWER)
        check(text(d, "#signed-in-as").startswith("victor"), "signed in as victor")
        d.get(f"{URL}/desk/operations/{KEY_B}")
        check(not d.find_elements(By.ID, "decide"), "no decision form for the view role")
        check("may read reviews but not decide" in text(d, "#cannot-decide"), "the page says why")
        csrf = d.find_element(By.CSS_SELECTOR, "form.who input[name=csrf]").get_attribute("value")
        post_form(d, f"/desk/operations/{KEY_B}/decide",
                  {"csrf": csrf, "decision": "failed", "note": "viewer tries anyway"})
        check(text(d, "#message-title") == "Not allowed", f"a viewer's decision is refused: {d.page_source[:400]}")
        step("the view role may not decide")
        sign_out(d)

        # A reviewer of another tenant sees none of these reviews, and cannot open them.
        sign_in(d, OTHER_TENANT)
        check(not d.find_elements(By.CSS_SELECTOR, "a.review-link"), "another tenant's reviews are hidden")
        d.get(f"{URL}/desk/operations/{KEY_A}")
        check(text(d, "#message-title") == "Not found", "another tenant's operation is not found")
        csrf = d.find_element(By.CSS_SELECTOR, "form.who input[name=csrf]").get_attribute("value")
        post_form(d, f"/desk/operations/{KEY_B}/decide",
                  {"csrf": csrf, "decision": "failed", "note": "not mine"})
        check(text(d, "#message-title") == "Not found", "another tenant's operation cannot be decided")
        step("reviewers see only their tenants")
        sign_out(d)

        # The decider: the list shows both reviews, with filters.
        sign_in(d, DECIDER)
        check(text(d, "#signed-in-as").startswith("alice"), "signed in as alice")
        keys = [a.get_attribute("data-key") for a in d.find_elements(By.CSS_SELECTOR, "a.review-link")]
        check(KEY_A in keys and KEY_B in keys, f"both reviews listed: {keys}")
        step(f"the list shows {len(keys)} open reviews")
        d.get(f"{URL}/desk/reviews?action_type=email.send")
        keys_email = [a.get_attribute("data-key") for a in d.find_elements(By.CSS_SELECTOR, "a.review-link")]
        check(KEY_A not in keys_email, "the action-type filter narrows the list")
        d.get(f"{URL}/desk/reviews?provider=bank&age=1d")
        check(not d.find_elements(By.CSS_SELECTOR, "a.review-link"), "nothing a day old yet")
        d.get(f"{URL}/desk/reviews?provider=bank")
        shot(d, "desk-list.png", DESKTOP)
        d.set_window_size(*PHONE)
        fits_the_screen(d, "the list")
        shot(d, "desk-list-phone.png", PHONE)
        step("filters work; the list fits a phone")

        # A decision without a note is refused by the server (the browser's own
        # `required` check is taken off first, as a crafted request would be).
        d.set_window_size(*DESKTOP)
        d.find_element(By.CSS_SELECTOR, f"a.review-link[data-key='{KEY_A}']").click()
        WebDriverWait(d, 10).until(lambda d: d.find_elements(By.ID, "decide"))
        check(text(d, "#status") == "unknown", "A is unknown before the decision")
        check("review_opened" in text(d, "#timeline"), "the timeline shows the review opening")
        shot(d, "desk-operation.png", DESKTOP)
        d.set_window_size(*PHONE)
        fits_the_screen(d, "the operation page")
        shot(d, "desk-operation-phone.png", PHONE)
        d.set_window_size(*DESKTOP)
        d.execute_script("document.getElementById('note').removeAttribute('required')")
        d.find_element(By.ID, "decision-succeeded").click()
        d.find_element(By.ID, "provider_operation_id").send_keys(PROVIDER_ID)
        d.find_element(By.ID, "record-decision").click()
        WebDriverWait(d, 10).until(lambda d: d.find_elements(By.ID, "error"))
        check("note is required" in text(d, "#error"), "a decision without a note is refused")
        check(text(d, "#status") == "unknown", "still unknown after the refusal")
        check(d.find_element(By.ID, "provider_operation_id").get_attribute("value") == PROVIDER_ID,
              "the form keeps what was typed")
        step("a decision without a note is refused")

        # A post without the session's CSRF token, and one from another site, are refused
        # (the browser's session cookie, sent by a plain HTTP client).
        cookies = {c["name"]: c["value"] for c in d.get_cookies()}
        check("__Host-oncely_desk" in cookies, f"the __Host- session cookie: {list(cookies)}")
        with httpx.Client(base_url=URL, cookies=cookies, follow_redirects=False) as c:
            good_csrf = d.find_element(By.CSS_SELECTOR, "form.who input[name=csrf]").get_attribute("value")
            form = {"decision": "failed", "note": "forged"}
            r = c.post(f"/desk/operations/{KEY_B}/decide", data={**form, "csrf": "00" * 32})
            check(r.status_code == 403 and "CSRF" in r.text, f"a wrong CSRF token: {r.status_code}")
            r = c.post(f"/desk/operations/{KEY_B}/decide", data=form)
            check(r.status_code == 403, f"no CSRF token: {r.status_code}")
            r = c.post(f"/desk/operations/{KEY_B}/decide", data={**form, "csrf": good_csrf},
                       headers={"Origin": "https://evil.example"})
            check(r.status_code == 403 and "another site" in r.text, f"a post from another site: {r.status_code}")
        step("posts without the CSRF token or from another site are refused")

        # The decision: succeeded, with the provider's id and a note.
        note = d.find_element(By.ID, "note")
        note.clear()
        note.send_keys("Seen in the bank statement of 2026-12-04, line 17")
        d.find_element(By.ID, "record-decision").click()
        WebDriverWait(d, 10).until(lambda d: d.find_elements(By.ID, "decided"))
        check(text(d, "#status") == "succeeded", f"A is succeeded: {text(d, '#status')}")
        check(text(d, "#provider-operation-id") == PROVIDER_ID, "with the provider's id")
        check("review:alice" in text(d, "#timeline"), "the timeline names who decided")
        check(not d.find_elements(By.ID, "decide"), "nothing left to decide")
        shot(d, "desk-decided.png", DESKTOP)
        step("A resolved as succeeded")

        # Deciding again (a second tab, a double click) changes nothing.
        post_form(d, f"/desk/operations/{KEY_A}/decide",
                  {"csrf": good_csrf, "decision": "failed", "note": "second try"})
        check(text(d, "#message-title") == "Already settled", "a second decision is refused")
        step("a second decision is refused")
        print(json.dumps({"ok": True, "key": KEY_A}), flush=True)
    finally:
        d.quit()


if __name__ == "__main__":
    main()
