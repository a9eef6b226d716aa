"""The console in Debian's Chromium against `llmfleet dev`'s processes, with real OpenAI SDK traffic."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TypeVar

import openai
import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.wait import WebDriverWait

from apps.cli.console_links import console_links
from apps.cli.platform import DEMO_TEAM, MODEL_8B, LocalPlatform
from tests.chaos.helpers import http_json

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]
T = TypeVar("T")


def until(what: str, probe: Callable[[], T | None], timeout_s: float = 20.0) -> T:
    """Poll `probe` with a deadline (the page is re-read by the probe itself)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def text(driver: webdriver.Chrome, css: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


OLD_PAGE = "document.documentElement.dataset.llmfleetOld"


def submit_and_wait(driver: webdriver.Chrome, by: str, value: str, within: WebElement | None = None) -> None:
    """Click a form's button and wait until the answer page has replaced this one and finished loading
    (never read the old page). The old document carries a mark no new document has. While the browser
    swaps documents, chromedriver may answer a question about the old one with an error instead of
    "stale" ("Node with given id does not belong to the document": seen with both cores busy, where
    `staleness_of` raised it); that only means the swap is under way, so the wait asks again."""
    driver.execute_script(f"{OLD_PAGE} = '1'")
    (within or driver).find_element(by, value).click()
    WebDriverWait(driver, 20, ignored_exceptions=(WebDriverException,)).until(
        lambda d: d.execute_script(f"return document.readyState === 'complete' && !{OLD_PAGE}")
    )


def sdk(platform: LocalPlatform, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=platform.gateway_url + "/v1", api_key=key, max_retries=0)


def chat(platform: LocalPlatform, key: str) -> None:
    """One chat request with `key`; the client is closed after it (an unclosed one's socket would be
    collected, with a ResourceWarning, in whichever later test the garbage collector runs)."""
    with sdk(platform, key) as client:
        client.chat.completions.create(
            model=MODEL_8B, messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )


def admin_api(
    platform: LocalPlatform, path: str, body: dict[str, object] | None, method: str = "POST"
) -> dict[str, object]:
    data: dict[str, object] = http_json(platform.gateway_url + path, method, body, platform.admin_token, 10)[
        1
    ]
    return data


def usage_requests(driver: webdriver.Chrome) -> int:
    """The usage table's requests for the 8B model, its columns found by their headings."""
    heads = [h.text for h in driver.find_elements(By.CSS_SELECTOR, "#usage-table thead th")]
    model, requests = heads.index("Model"), heads.index("Requests")
    cells = [
        r.find_elements(By.TAG_NAME, "td")
        for r in driver.find_elements(By.CSS_SELECTOR, "#usage-table tbody tr")
    ]
    return sum(int(c[requests].text) for c in cells if len(c) == len(heads) and c[model].text == MODEL_8B)


def signed_in(driver: webdriver.Chrome, url: str) -> None:
    """Open `url` afresh (a one-time link: the page's script then posts its token; wait for that)."""
    driver.delete_all_cookies()
    driver.get("about:blank")
    driver.get(url)
    if "#token=" in url:
        WebDriverWait(driver, 20, ignored_exceptions=(WebDriverException,)).until(
            lambda d: (
                d.execute_script("return document.readyState === 'complete'")
                and ("/console/signin" not in d.current_url or d.find_elements(By.ID, "error"))
            )
        )


def test_team_sees_usage_creates_and_revokes_a_key(
    platform: LocalPlatform, chrome: webdriver.Chrome, artifacts: Path
) -> None:
    assert platform.credentials is not None
    for _ in range(3):
        chat(platform, platform.credentials.api_key)
    links = console_links(platform.gateway_url, platform.issuer, DEMO_TEAM)
    chrome.get(platform.gateway_url + "/console/signin")
    chrome.save_screenshot(str(artifacts / "signin.png"))
    signed_in(chrome, links.team)
    assert chrome.current_url.endswith("/console/team")  # the token left the address bar
    assert text(chrome, "#team-name") == DEMO_TEAM

    def seen() -> int | None:
        chrome.get(platform.gateway_url + "/console/team")
        return usage_requests(chrome) if usage_requests(chrome) >= 3 else None

    assert until("3 requests in the usage table", seen) == 3
    until("the charts drawn", lambda: len(chrome.find_elements(By.CSS_SELECTOR, ".chart canvas")) == 3)
    assert chrome.find_element(By.ID, "usage-csv").get_attribute("href")
    chrome.save_screenshot(str(artifacts / "team.png"))

    # Times are shown in the viewer's zone (the script rewrote the ISO text; the title keeps it).
    first_time = chrome.find_element(By.CSS_SELECTOR, "#recent-table time")
    assert first_time.text != first_time.get_attribute("datetime")

    chrome.find_element(By.ID, "key-name").send_keys("browser-key")
    submit_and_wait(chrome, By.ID, "create-key-button")
    secret = text(chrome, "#new-key")
    assert secret.startswith("sk-lf-")
    chrome.save_screenshot(str(artifacts / "key-created.png"))
    chat(platform, secret)

    row = next(
        r for r in chrome.find_elements(By.CSS_SELECTOR, "#keys-table tbody tr") if "browser-key" in r.text
    )
    submit_and_wait(chrome, By.CSS_SELECTOR, "button.revoke", within=row)
    assert "revoked" in text(chrome, "#notice")

    def refused() -> bool:
        try:
            chat(platform, secret)
        except openai.AuthenticationError:
            return True
        return False

    assert until("the revoked key to get 401", refused, timeout_s=10)

    # Bad input: a message on the page, nothing else.
    chrome.get(platform.gateway_url + "/console/team?from=2026-03-10&to=2026-03-01")
    assert "range is empty" in text(chrome, "#error")


def test_second_team_cannot_see_or_act_on_the_first(
    platform: LocalPlatform, chrome: webdriver.Chrome, artifacts: Path
) -> None:
    assert platform.credentials is not None
    admin_api(platform, "/admin/teams", {"name": "rival", "credits": 10})
    demo_keys = [k for k in platform_keys(platform) if k["team"] == DEMO_TEAM and not k["revoked_at"]]
    signed_in(chrome, platform.gateway_url + "/console/signin")
    chrome.find_element(By.ID, "token").send_keys(platform.issuer.mint("rival-user", team="rival"))
    submit_and_wait(chrome, By.ID, "signin")
    assert chrome.find_elements(By.ID, "team-name"), chrome.page_source
    assert text(chrome, "#team-name") == "rival"
    page = chrome.page_source
    for key in demo_keys:
        assert str(key["prefix"]) not in page
    assert usage_requests(chrome) == 0
    chrome.save_screenshot(str(artifacts / "team-rival.png"))
    # A forged form with this session's own CSRF token, aimed at the demo team's key.
    chrome.execute_script(
        "var f = document.createElement('form'); f.method = 'post'; f.action = arguments[0];"
        "var i = document.createElement('input'); i.name = 'csrf';"
        "i.value = document.querySelector('input[name=csrf]').value; f.appendChild(i);"
        "document.body.appendChild(f); f.submit();",
        f"/console/team/keys/{demo_keys[0]['id']}/revoke",
    )
    assert "has no key" in until("the refusal", lambda: chrome.find_elements(By.ID, "error"))[0].text
    chat(platform, platform.credentials.api_key)  # the demo key still works


def test_admin_adds_credits_and_drains_a_node(
    platform: LocalPlatform, chrome: webdriver.Chrome, artifacts: Path
) -> None:
    links = console_links(platform.gateway_url, platform.issuer, DEMO_TEAM)
    signed_in(chrome, links.admin)
    assert chrome.current_url.endswith("/console/admin")
    demo_row = next(
        r
        for r in chrome.find_elements(By.CSS_SELECTOR, "#teams-table tbody tr")
        if r.find_element(By.CLASS_NAME, "team-name").text == DEMO_TEAM
    )
    team_id = demo_row.get_attribute("id")
    before = float(demo_row.find_element(By.CLASS_NAME, "balance").text.replace(",", ""))
    chrome.save_screenshot(str(artifacts / "admin.png"))

    def credit(amount: str) -> None:
        chrome.find_element(
            By.CSS_SELECTOR, f"#credit-team option[value='{str(team_id).split('-')[1]}']"
        ).click()
        chrome.find_element(By.ID, "credit-amount").send_keys(amount)
        submit_and_wait(chrome, By.ID, "add-credits")

    def balance() -> float:
        return float(text(chrome, f"#{team_id} .balance").replace(",", ""))

    credit("-5")
    assert "positive" in text(chrome, "#error")
    assert balance() == before
    credit("1000")
    assert "Added 1000 credits" in text(chrome, "#notice")
    assert 999 <= balance() - before <= 1000  # a request of the other tests may settle meanwhile

    node_id = platform.config.nodes[1].node_id

    def node_state() -> str:
        return text(chrome, f"[id='node-{node_id}'] .state")

    def ready() -> bool:
        chrome.get(platform.gateway_url + "/console/admin")
        return node_state() == "ready"

    until("the node to be ready before draining it", ready)  # a loaded CI may have it reconnecting
    submit_and_wait(chrome, By.ID, f"drain-{node_id}")
    notices = chrome.find_elements(By.ID, "notice")
    errors = [e.text for e in chrome.find_elements(By.ID, "error")]
    assert notices, (
        f"no notice after the drain; errors on the page: {errors}; orchestrator log:\n"
        + platform.orchestrators[0].log_tail(60)
    )
    assert "Drain requested" in notices[0].text

    def state() -> str | None:
        chrome.get(platform.gateway_url + "/console/admin")
        now = node_state()
        # Draining while it finishes; a drained agent then leaves (its heartbeat key expires: dead).
        return now if now in ("draining", "dead") else None

    until("the node to drain", state)
    chrome.save_screenshot(str(artifacts / "admin-drained.png"))


def platform_keys(platform: LocalPlatform) -> list[dict[str, object]]:
    req = urllib.request.Request(
        platform.gateway_url + "/admin/keys", headers={"Authorization": f"Bearer {platform.admin_token}"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        data: list[dict[str, object]] = json.loads(resp.read())["data"]
        return data


def test_sign_out_revokes_the_session_and_a_link_signs_in_once(
    platform: LocalPlatform, chrome: webdriver.Chrome, artifacts: Path
) -> None:
    """Issue 27: a saved cookie survived sign-out; the one-use admin link could be used again."""
    links = console_links(platform.gateway_url, platform.issuer, DEMO_TEAM)
    assert "?" not in links.admin  # the token travels in the fragment, never to a server log
    signed_in(chrome, links.admin)
    assert chrome.current_url == platform.gateway_url + "/console/admin"  # no token left in the bar
    saved = chrome.get_cookie("lf_console")
    assert saved
    submit_and_wait(chrome, By.ID, "signout")
    assert chrome.current_url.endswith("/console/signin")
    chrome.add_cookie({k: saved[k] for k in ("name", "value", "path")})  # the saved copy, replayed
    chrome.get(platform.gateway_url + "/console/admin")
    assert chrome.current_url.endswith("/console/signin")
    assert not chrome.find_elements(By.ID, "teams-table")

    chrome.get("about:blank")
    chrome.get(links.admin)  # the same link again: through the form, refused
    assert "already used" in until("the refusal", lambda: chrome.find_elements(By.ID, "error"))[0].text
    chrome.save_screenshot(str(artifacts / "signin-link-used.png"))
    chrome.get(platform.gateway_url + "/console/admin")
    assert chrome.current_url.endswith("/console/signin")


class _Attacker(BaseHTTPRequestHandler):
    """Another site's page that posts its own token to the console's sign-in (login CSRF)."""

    form = ""

    def do_GET(self) -> None:
        body = self.form.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


def test_another_site_cannot_sign_the_browser_in(
    platform: LocalPlatform, chrome: webdriver.Chrome, artifacts: Path
) -> None:
    """Issue 27: a cross-site POST to /console/signin signed the victim into the attacker's session."""
    admin_api(platform, "/admin/teams", {"name": "attacker", "credits": 1})
    token = platform.issuer.mint("attacker-user", team="attacker")
    signed_in(chrome, platform.gateway_url + "/console/signin")  # the victim has a sign-in form open
    handler = type("Page", (_Attacker,), {"form": (
        f'<form id="f" method="post" action="{platform.gateway_url}/console/signin">'
        f'<input name="token" value="{token}"><input name="signin_csrf" value="guess"></form>'
        "<script>document.getElementById('f').submit()</script>"
    )})  # fmt: skip
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        chrome.get(f"http://127.0.0.1:{server.server_address[1]}/")
        error = until("the refusal", lambda: chrome.find_elements(By.ID, "error"))[0]
        assert "did not come from this console" in error.text
        chrome.save_screenshot(str(artifacts / "signin-cross-site.png"))
    finally:
        server.shutdown()
        server.server_close()
    chrome.get(platform.gateway_url + "/console/team")
    assert chrome.current_url.endswith("/console/signin")  # not signed in as the attacker


def cached_chat(client: openai.OpenAI, question: str) -> str:
    """One greedy request (the cache answers temperature 0 only, by default); its `x-llmfleet-cache`."""
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL_8B, messages=[{"role": "user", "content": question}], max_tokens=5, temperature=0
    )
    return str(raw.headers.get("x-llmfleet-cache", ""))


def cache_cells(driver: webdriver.Chrome, row_id: str) -> dict[str, str]:
    """The cache panel's row `row_id`, its cells by class (`cache-hits` -> `hits`, ...)."""
    row = driver.find_element(By.CSS_SELECTOR, f"#cache-table tr[id='{row_id}']")
    return {
        str(td.get_attribute("class")).removeprefix("cache-"): td.text
        for td in row.find_elements(By.TAG_NAME, "td")
    }


def test_the_cache_panel_shows_real_hits_and_misses(
    platform: LocalPlatform, chrome: webdriver.Chrome, artifacts: Path
) -> None:
    team = admin_api(platform, "/admin/teams", {"name": "cachers", "credits": 100})
    secret = str(admin_api(platform, "/admin/keys", {"team": "cachers", "name": "cache-key"})["key"])
    admin_api(platform, f"/admin/teams/{team['id']}/cache", {"models": {MODEL_8B: {}}}, method="PUT")
    stats = f"/admin/teams/{team['id']}/cache/stats"
    with sdk(platform, secret) as client:
        assert cached_chat(client, "Why is the sky blue?") == "miss"
        until("the answer stored", lambda: admin_api(platform, stats, None, method="GET")["entries"] == 1)
        assert cached_chat(client, "Why is the sky blue?") == "hit"
        assert cached_chat(client, "Why is the sky blue?") == "hit"
        assert cached_chat(client, "Why is the sea salty?") == "miss"
    signed_in(chrome, platform.gateway_url + "/console/signin")
    chrome.find_element(By.ID, "token").send_keys(platform.issuer.mint("cache-user", team="cachers"))
    submit_and_wait(chrome, By.ID, "signin")
    assert text(chrome, "#team-name") == "cachers"

    def settled() -> dict[str, str] | None:  # the misses are settled by the orchestrator after their answer
        chrome.get(platform.gateway_url + "/console/team")
        if not chrome.find_elements(By.ID, "cache-table"):
            return None
        total = cache_cells(chrome, "cache-total")
        return total if total["misses"] == "2" else None

    total = until("the cache panel with both misses", settled)
    row = cache_cells(chrome, f"cache-{MODEL_8B}")
    assert (total["label"], row["label"]) == ("Total", MODEL_8B)
    for cells in (total, row):
        assert (cells["hits"], cells["misses"], cells["rate"]) == ("2", "2", "50.0%")
        assert float(cells["credits"]) > 0  # a hit's cost is rounded up to a whole microcredit
        assert int(cells["tokens"]) > 0
        assert cells["gpu"].endswith(" GPU-s")
        assert float(cells["gpu"].split()[0]) > 0
    assert "an estimate, not a measurement" in text(chrome, "#cache-note")
    chrome.find_element(By.ID, "cache").screenshot(str(artifacts / "team-cache.png"))

    signed_in(chrome, console_links(platform.gateway_url, platform.issuer, DEMO_TEAM).admin)
    cells = cache_cells(chrome, f"cache-{team['id']}")
    assert (cells["label"], cells["hits"], cells["misses"], cells["rate"]) == ("cachers", "2", "2", "50.0%")
    chrome.find_element(By.ID, "cache").screenshot(str(artifacts / "admin-cache.png"))


def whole_page(driver: webdriver.Chrome, path: Path) -> None:
    """A screenshot of the whole page, not only the window's height (docs/console-team.png and
    docs/console-admin.png are copies of `team-full.png` and `admin-full.png`): the window is made as
    tall as the document for the shot, then given its size back."""
    size = driver.get_window_size()
    chrome_px = int(driver.execute_script("return window.outerHeight - window.innerHeight"))
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    driver.set_window_size(size["width"], max(size["height"], height + chrome_px))
    try:
        driver.save_screenshot(str(path))
    finally:
        driver.set_window_size(size["width"], size["height"])


def decision_cells(driver: webdriver.Chrome) -> dict[str, dict[str, str]]:
    """The guardrail panel's rows by id, their cells by class (`gr-count` -> `count`, ...)."""
    return {
        str(row.get_attribute("id")): {
            str(td.get_attribute("class")).removeprefix("gr-"): td.text
            for td in row.find_elements(By.TAG_NAME, "td")
            if td.get_attribute("class")
        }
        for row in driver.find_elements(By.CSS_SELECTOR, "#guardrails-table tbody tr")
    }


GUARDED_POLICY = {
    "input": [
        {"detector": "ssn", "action": "block"},
        {"detector": "email", "action": "redact"},
        {"detector": "dob", "action": "flag"},
    ],
    # enginesim answers with common English words: its two-letter ones are redacted (counted from the text).
    "output": [{"detector": "short_word", "action": "redact"}],
    "patterns": [{"name": "short_word", "pattern": "\\b[a-z]{2}\\b"}],
}
GUARDED_PROMPTS = (
    "Write to jane.doe@example.com and john@example.org about the claim.",
    "Patient born on 03/04/1980; send the summary to a.b@example.com.",
)


def test_the_guardrail_panel_shows_real_decisions(
    platform: LocalPlatform, chrome: webdriver.Chrome, artifacts: Path
) -> None:
    team = admin_api(platform, "/admin/teams", {"name": "guarded", "credits": 100})
    secret = str(admin_api(platform, "/admin/keys", {"team": "guarded", "name": "guarded-key"})["key"])
    admin_api(platform, f"/admin/teams/{team['id']}/guardrails", GUARDED_POLICY, method="PUT")
    redacted = 0
    with sdk(platform, secret) as client:
        for prompt in GUARDED_PROMPTS:
            done = client.chat.completions.create(
                model=MODEL_8B, messages=[{"role": "user", "content": prompt}], max_tokens=24
            )
            redacted += (done.choices[0].message.content or "").count("[REDACTED:SHORT_WORD]")
        with pytest.raises(openai.BadRequestError) as blocked:
            client.chat.completions.create(
                model=MODEL_8B, messages=[{"role": "user", "content": "My SSN is 123-45-6789."}], max_tokens=5
            )
        assert blocked.value.code == "guardrail_blocked"
    assert redacted > 0  # 48 words of common English: some are two letters long
    expected = {
        "guardrail-input-dob-flag": "1",
        "guardrail-input-email-redact": "3",
        "guardrail-input-ssn-block": "1",
        "guardrail-output-short_word-redact": str(redacted),
        "guardrail-total": str(5 + redacted),
    }
    signed_in(chrome, platform.gateway_url + "/console/signin")
    chrome.find_element(By.ID, "token").send_keys(platform.issuer.mint("guard-user", team="guarded"))
    submit_and_wait(chrome, By.ID, "signin")
    assert text(chrome, "#team-name") == "guarded"

    def counted() -> dict[str, dict[str, str]] | None:  # counted at each request's end, after its answer
        chrome.get(platform.gateway_url + "/console/team")
        cells = decision_cells(chrome)
        return cells if {k: v.get("count") for k, v in cells.items()} == expected else None

    cells = until("the guardrail panel with every decision", counted)
    assert (
        cells["guardrail-input-email-redact"]["check"],
        cells["guardrail-input-email-redact"]["action"],
    ) == (
        "email",
        "redact",
    )
    assert text(chrome, "#guardrails-summary") == f"{3 + redacted} redacted · 1 blocked · 1 flagged"
    page = chrome.page_source
    for matched in ("jane.doe@example.com", "john@example.org", "03/04/1980", "123-45-6789"):
        assert matched not in page  # counts only
    assert "never stored or shown" in text(chrome, "#guardrails-note")
    chrome.find_element(By.ID, "guardrails").screenshot(str(artifacts / "team-guardrails.png"))
    whole_page(chrome, artifacts / "team-full.png")

    signed_in(chrome, console_links(platform.gateway_url, platform.issuer, DEMO_TEAM).admin)
    admin = decision_cells(chrome)
    for row_id, count in expected.items():
        if row_id != "guardrail-total":
            row = admin[row_id.replace("guardrail-", f"guardrail-{team['id']}-")]
            assert (row["team"], row["count"]) == ("guarded", count)
    chrome.find_element(By.ID, "guardrails").screenshot(str(artifacts / "admin-guardrails.png"))
    whole_page(chrome, artifacts / "admin-full.png")
