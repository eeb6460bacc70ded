"""The server's own page (GET /) and the `trace` extension it reads.

Over a toy engine in this process (fast): the page and its files load without the API key while the
API keeps needing it, the trace is opt-in and adds up to the reply's own statistics. Against
`specdecode serve` with the embedded model in a headless chromium (selenium; skipped without
chromium and chromedriver): a greedy reply typed and sent in the page is the API's, its Figure 1
tokens and call groups are the reply's `usage.speculative`, and the key is asked for, refused
without and used once entered. The browser test saves the screenshot the README shows.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from starlette.testclient import TestClient  # noqa: E402

from specdecode.lossless import ToyModel, ToyTokenizer  # noqa: E402
from specdecode.server.app import create_app  # noqa: E402
from specdecode.server.engine import Engine  # noqa: E402
from specdecode.server.request import RequestError, parse_request  # noqa: E402

KEY = "page-test-key"
SCREENSHOT = Path(__file__).parent.parent / "benchmarks" / "results" / "page.png"
PIECES = ["a", "b", " "]  # a toy vocabulary of three pieces: lookup drafts are often right


@pytest.fixture(scope="module")
def toy():
    """The app over an engine of a toy target (no model to load), with an API key."""
    engine = Engine(ToyModel(3, seed=3, tokenizer=ToyTokenizer(PIECES)), {"lookup": "lookup"}, "lookup")
    try:
        with TestClient(create_app(engine, "toy", api_key=KEY)) as client:
            yield client
    finally:
        engine.close()


AUTH = {"Authorization": f"Bearer {KEY}"}


def events(reply) -> list[dict]:
    """A stream's chunks (its `data:` events before [DONE])."""
    lines = [line[len("data: "):] for line in reply.text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", lines[-3:]
    return [json.loads(line) for line in lines[:-1]]


def test_the_page_and_its_files_load_without_the_key_the_api_still_needs_it(toy):
    page = toy.get("/")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    assert "<title>specdecode</title>" in page.text and 'src="/page/page.js"' in page.text
    for name, kind in (("page.js", "text/javascript; charset=utf-8"), ("page.css", "text/css; charset=utf-8"),
                       ("index.html", "text/html; charset=utf-8")):
        asset = toy.get("/page/" + name)
        assert asset.status_code == 200 and asset.headers["content-type"] == kind, (name, asset.headers)
        assert asset.headers["x-content-type-options"] == "nosniff" and asset.content
    assert toy.get("/page/nothing.js", headers=AUTH).status_code == 404
    assert toy.get("/page/nothing.js").status_code == 401  # not one of the page's files: the key's
    assert toy.get("/v1/models").status_code == 401 and toy.get("/v1/models", headers=AUTH).status_code == 200
    body = {"model": "toy", "prompt": "ab", "max_tokens": 2}
    assert toy.post("/v1/completions", json=body).status_code == 401
    paths = toy.get("/openapi.json", headers=AUTH).json()["paths"]
    assert "/" not in paths and not any(path.startswith("/page/") for path in paths)
    metrics = toy.get("/metrics", headers=AUTH).text
    assert 'endpoint="/",status="200"' in metrics and 'endpoint="/page/{name}",status="200"' in metrics


def test_trace_is_opt_in_and_adds_up_to_the_reply_s_statistics(toy):
    body = {"model": "toy", "prompt": "ab ab ab ab", "max_tokens": 24, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "specdecode": {"gamma": 4}}
    plain = events(toy.post("/v1/completions", json=body, headers=AUTH))
    assert not any("specdecode" in chunk for chunk in plain)  # OpenAI's chunks, nothing more
    traced = events(toy.post("/v1/completions", json={**body, "specdecode": {"gamma": 4, "trace": True}},
                             headers=AUTH))
    text = "".join(c["choices"][0]["text"] for c in traced if c["choices"])
    assert text == "".join(c["choices"][0]["text"] for c in plain if c["choices"]) and text
    calls = [call for c in traced for call in c.get("specdecode", {}).get("trace", [])]
    spec = traced[-1]["usage"]["speculative"]
    assert [call["call"] for call in calls] == list(range(1, spec["target_calls"] + 1))
    assert sum(len(call["accepted"]) for call in calls) == spec["accepted_tokens"] > 0
    assert sum(call["proposed"] for call in calls) == spec["draft_tokens"]
    assert "".join("".join(call["accepted"]) + call["target"] for call in calls) == text
    assert any(call["rejected"] for call in calls) and calls[0]["proposed"] == 0  # the prompt's call drafts nothing
    assert all(call["target_ms"] > 0 and call["draft_ms"] >= 0 for call in calls)
    whole = toy.post("/v1/completions", json={**body, "stream": False, "specdecode": {"gamma": 4, "trace": True}},
                     headers=AUTH).json()
    fields = ("call", "accepted", "target", "rejected", "proposed")  # all but the times
    assert [[c[f] for f in fields] for c in whole["specdecode"]["trace"]] == [[c[f] for f in fields] for c in calls]
    assert "specdecode" not in toy.post("/v1/completions", json={**body, "stream": False}, headers=AUTH).json()
    refused = toy.post("/v1/completions", json={**body, "specdecode": {"trace": "yes"}}, headers=AUTH)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "specdecode.trace"


def test_trace_is_parsed_as_a_boolean():
    body = {"model": "m", "prompt": "hi"}
    assert not parse_request(body, "completion").trace
    assert parse_request({**body, "specdecode": {"trace": True}}, "completion").trace
    assert not parse_request({**body, "specdecode": {"trace": None}}, "completion").trace
    for wrong in (1, "true", [True]):
        with pytest.raises(RequestError, match="'specdecode.trace' must be a boolean") as refused:
            parse_request({**body, "specdecode": {"trace": wrong}}, "completion")
        assert refused.value.status == 400 and refused.value.param == "specdecode.trace"


# -- in a real browser, against `specdecode serve` with the embedded model ------------------------

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
CHROMEDRIVER = shutil.which("chromedriver")
PROMPT = ("Repeat this text exactly, word for word: 'The quick brown fox jumps over the lazy dog, and then the fox "
          "runs into the forest to hide behind a big old tree until the sun goes down.'")
SETTINGS = {"temperature": 0, "seed": 7, "max_tokens": 32, "specdecode": {"gamma": 4}}


@pytest.fixture(scope="module")
def server():
    from test_server import _start_server, _stop

    # a drafter without a shared memory: the page's request and the API's same request then draft alike
    base, process = _start_server("--model-name", "smol", "--api-key", KEY, "--max-tokens", "64", "--max-batch", "2",
                                  "--draft", "lookup")
    yield base
    _stop(process)


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("chromium and chromedriver are not installed (`make test-setup` installs them where apt runs)")
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console, read below
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1100"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


def api(base: str, body: dict) -> dict:
    request = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **AUTH})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def wait(driver, condition, seconds: float = 60):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, seconds).until(lambda d: condition(d))


def shown_text(driver, element) -> str:
    """The reply as the page shows it: its tokens' text, the struck-through proposals left out."""
    return driver.execute_script("const c = arguments[0].querySelector('.content').cloneNode(true);"
                                 "c.querySelectorAll('.rejected').forEach((r) => r.remove()); return c.textContent;",
                                 element)


@pytest.mark.slow
def test_the_page_streams_figure_1_of_the_api_s_greedy_reply_with_the_key(browser, server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver, find = browser, browser.find_element
    driver.get(server + "/")
    wait(driver, lambda d: find(By.ID, "key-form").is_displayed())  # the API needs a key: the page asks
    for field, value in (("temperature", "0"), ("seed", "7"), ("max-tokens", "32")):
        find(By.ID, field).send_keys(value)
    find(By.CSS_SELECTOR, "#gamma option[value='4']").click()
    find(By.ID, "prompt").send_keys(PROMPT, Keys.ENTER)  # Enter sends
    wait(driver, lambda d: find(By.CSS_SELECTOR, ".turn.assistant").get_attribute("data-state") == "error")
    assert "401" in find(By.ID, "status").text and "401" in find(By.CSS_SELECTOR, ".turn.assistant").text
    assert find(By.ID, "prompt").get_attribute("value") == PROMPT  # the refused message is back in the box

    find(By.ID, "api-key").send_keys(KEY, Keys.ENTER)
    wait(driver, lambda d: "kept" in find(By.ID, "key-note").text)
    assert driver.execute_script("return sessionStorage.getItem('specdecode.apiKey')") == KEY
    assert driver.execute_script("return localStorage.length") == 0
    find(By.ID, "prompt").send_keys(Keys.ENTER)
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".turn.assistant")[-1].get_attribute("data-state")
         in ("done", "error"))
    reply = driver.find_elements(By.CSS_SELECTOR, ".turn.assistant")[-1]
    assert reply.get_attribute("data-state") == "done", find(By.ID, "status").text

    expected = api(server, {"model": "smol", "messages": [{"role": "user", "content": PROMPT}], **SETTINGS})
    assert shown_text(driver, reply) == expected["choices"][0]["message"]["content"] != ""
    spec = expected["usage"]["speculative"]
    accepted = reply.find_elements(By.CSS_SELECTOR, ".tok.accepted")
    calls = reply.find_elements(By.CSS_SELECTOR, ".call")
    assert len(accepted) == spec["accepted_tokens"] > 0 and len(calls) == spec["target_calls"]
    stat = {dd.get_attribute("data-stat"): dd.text for dd in driver.find_elements(By.CSS_SELECTOR, "#numbers dd")}
    assert stat["accepted_tokens"] == str(len(accepted)) and stat["target_calls"] == str(len(calls))  # its own usage
    assert len(reply.find_elements(By.CSS_SELECTOR, ".tok.target")) == len(calls)
    assert len(driver.find_elements(By.CSS_SELECTOR, "#timeline rect.target")) == len(calls)
    assert find(By.ID, "model").text.startswith("model smol")

    # Figure 1's kinds differ in style too; the rejected proposals show on demand, struck through
    def style(element, name: str) -> str:
        return driver.execute_script("return getComputedStyle(arguments[0])[arguments[1]]", element, name)

    assert "underline" in style(accepted[0], "textDecorationLine")
    assert int(style(reply.find_element(By.CSS_SELECTOR, ".tok.target"), "fontWeight")) >= 700
    rejected = reply.find_elements(By.CSS_SELECTOR, ".rejected")
    assert all(not r.is_displayed() for r in rejected)
    find(By.ID, "show-rejected").click()
    assert all(style(r, "display") == "inline" and "line-through" in style(r, "textDecorationLine") for r in rejected)
    driver.execute_script("arguments[0].dispatchEvent(new MouseEvent('mouseover', {bubbles: true}))", calls[-1])
    assert find(By.ID, "call-info").text.startswith(f"target call {len(calls)}:")
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#live-numbers dd")
         and "401" not in find(By.ID, "live-numbers").text, 10)  # /metrics, polled with the key
    # no script error on the way (the refused calls' 401s are the only failed loads)
    errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"
              and "status of 401" not in e["message"]]
    assert not errors, errors
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    driver.set_window_size(1280, 1720)  # the chat, the settings and the last reply's charts
    driver.save_screenshot(str(SCREENSHOT))

    driver.set_window_size(390, 844)  # a phone's width: one column, nothing wider than the screen
    assert driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    driver.set_window_size(1280, 1100)


@pytest.mark.slow
def test_a_stream_without_trace_carries_no_extension_field(server):
    body = {"model": "smol", "messages": [{"role": "user", "content": PROMPT}], "stream": True,
            "stream_options": {"include_usage": True}, **SETTINGS}
    request = urllib.request.Request(server + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **AUTH})
    with urllib.request.urlopen(request, timeout=120) as response:
        chunks = [json.loads(line[6:]) for line in response.read().decode().split("\n")
                  if line.startswith("data: {")]
    assert chunks and not any("specdecode" in chunk for chunk in chunks)
    assert set(chunks[0]) <= {"id", "object", "created", "model", "choices"}
