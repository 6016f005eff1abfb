"""The console in a real browser: Debian's chromium driven by Playwright (the system
browser, never a downloaded one) against the real stack (broker, worker, API).

A person logs in with a key, finds a memory written through the API, opens its
story (source turns, links); another tenant's key and another agent of the same user
never see it; an operator forgets a subject and watches it complete; a dead-lettered
record shows its reason. ``MEMSTREAM_CONSOLE_SHOTS=<dir>`` saves the pages'
screenshots there (the README's come from ``python -m memstream.bench.console_shots``)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaProducer

from tests.interfaces.console.console_support import Written, write_story
from tests.interfaces.iface_stack import Stack
from memstream.interfaces.console.session import ensure_operator_token

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = os.environ.get("MEMSTREAM_CONSOLE_SHOTS")
WAIT_MS = 60_000  # readiness bound for the worker to catch up, not a speed check

if CHROMIUM is None:
    pytest.skip("no chromium on PATH: the browser tests need Debian's chromium (apt-get install chromium; .ci/run installs it)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extras (pip install -e '.[test]')")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def story(stack: Stack) -> Written:
    return write_story(stack, "planner")


def _page(browser: Any) -> Any:
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    return page


def _shot(page: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)


def _log_in(page: Any, stack: Stack, credential: str) -> None:
    page.goto(f"{stack.base_url}/console")
    assert page.url.endswith("/console/login")
    page.get_by_label("API key or operator token").fill(credential)
    page.get_by_role("button", name="Log in").click()


def test_a_key_logs_in_finds_the_memory_and_reads_its_story(browser: Any, stack: Stack, story: Written) -> None:
    page = _page(browser)
    _log_in(page, stack, stack.keys["planner"])
    page.wait_for_url(re.compile(r"/console/spaces$"))
    assert "trust/u1" in page.locator("main").inner_text()
    _shot(page, "spaces")
    page.get_by_role("link", name="Search", exact=True).click()
    page.wait_for_url(re.compile(r"/console/search"))  # keys typed before the page loads would go nowhere
    page.keyboard.press("/")  # the shortcut focuses the query box
    page.wait_for_function("document.activeElement && document.activeElement.id === 'q'")
    page.keyboard.type(f"where does the user live {story.mark}")
    page.keyboard.press("Enter")
    hit = page.locator(".result", has_text=f"lives in Lisbon {story.mark}")
    hit.locator("summary").click()
    assert hit.locator(".parts tr").count() >= 3  # the score parts, as bars
    assert hit.locator(".parts .bar").first.is_visible()
    _shot(page, "search")
    hit.locator("a.content").click()
    page.wait_for_url(re.compile(rf"/console/memories/{story.memory_id}"))
    source = page.locator(".turn.source")
    assert f"I moved to Lisbon {story.mark}" in source.inner_text()
    assert f"before {story.mark}" in page.locator("#sources").inner_text()  # the conversation around it
    links = page.locator("#links")
    assert "supersedes" in links.inner_text() and f"lives in Porto {story.mark}" in links.inner_text()
    assert page.locator("svg.graph .edge").count() == 1
    _shot(page, "memory")
    page.goto(f"{stack.base_url}/console/ledger")
    page.wait_for_function(f"document.body.innerText.includes('{story.subject}')")
    pending = page.locator("#pending tr", has_text=story.waiting)  # the page's script loads it from the log
    assert "covers 3 of 10 horizon days" in pending.inner_text()
    assert story.subject not in page.locator("#pending").inner_text()  # settled: in the ledger, not pending
    assert "#1 of the 5 newest" in page.locator("#lessons li", has_text=story.subject).inner_text()
    _shot(page, "ledger")
    page.goto(f"{stack.base_url}/console/timeline?start=2020-01-01T00:00:00&end=2030-01-01T00:00:00")
    assert f"lives in Lisbon {story.mark}" in page.locator("#events").inner_text()
    _shot(page, "timeline")
    page.context.close()


@pytest.mark.parametrize("bank", ["globex", "spy"])
def test_another_tenant_or_agent_never_sees_it(browser: Any, stack: Stack, story: Written, bank: str) -> None:
    page = _page(browser)
    _log_in(page, stack, stack.keys[bank])
    page.wait_for_url(re.compile(r"/console/spaces$"))
    page.goto(f"{stack.base_url}/console/search?q=Lisbon+{story.mark}")
    assert "0 result(s)" in page.locator("#results").inner_text()
    for path in (f"/console/memories/{story.memory_id}", f"/console/memories/{story.old_id}", "/console/ledger",
                 "/console/timeline?start=2020-01-01T00:00:00&end=2030-01-01T00:00:00", "/console/spaces"):
        page.goto(stack.base_url + path)
        if path == "/console/ledger":
            page.wait_for_selector("#pending-state")  # the pending decisions, loaded by the page's script
        text = page.locator("body").inner_text()
        # a page may echo what was asked (a 404's id, a filter's subject), never what was written
        assert not any(s in text for s in story.secrets if s not in path), (bank, path)
    page.goto(f"{stack.base_url}/console/memories/{story.memory_id}")
    assert "404" in page.locator("h1").inner_text()
    page.context.close()


def test_an_operator_forgets_a_subject_and_sees_it_complete(browser: Any, stack: Stack) -> None:
    mark = uuid.uuid4().hex[:8]
    user = f"gone{mark}"
    with httpx.Client(base_url=stack.base_url, timeout=60) as c:
        r = c.post("/v1/memories", headers=stack.headers("acme"), json={"content": f"secret {mark}", "scope": {"user_id": user}})
        assert r.status_code == 202, r.text
        got = c.get(f"/v1/memories/{r.json()['memory_id']}", headers=stack.headers("acme"),
                    params={"user_id": user, "min_position": r.json()["position"], "wait_s": 20})
        assert got.status_code == 200
    page = _page(browser)
    _log_in(page, stack, ensure_operator_token(stack.settings).read_text().strip())
    page.wait_for_url(re.compile(r"/console/ops$"))
    _shot(page, "operations")
    page.get_by_role("link", name="Forget", exact=True).click()
    page.get_by_label("Team", exact=True).fill("acme")
    page.get_by_label("User (empty: every user of the team)").fill(user)
    page.get_by_role("button", name="Review").click()
    page.get_by_label(f"Type acme/{user} to confirm").fill(f"acme/{user}")
    page.get_by_role("button", name=f"Forget acme/{user}").click()
    page.wait_for_url(re.compile(r"/console/ops/forget/status"))
    try:
        page.wait_for_selector('#forget-state[data-complete="true"]')  # the page polls until the shards applied it
    except sync_api.TimeoutError:
        pytest.fail(f"the forget never showed complete: {page.locator('main').inner_text()}")
    assert page.locator("#forget-state").inner_text().startswith("Complete")
    _shot(page, "forget")
    page.context.close()
    with httpx.Client(base_url=stack.base_url, timeout=60) as c:
        gone = c.get(f"/v1/memories/{got.json()['memory_id']}", headers=stack.headers("acme"), params={"user_id": user})
        assert gone.status_code == 404


def test_a_dead_lettered_record_shows_its_reason(browser: Any, stack: Stack) -> None:
    mark = uuid.uuid4().hex[:8]

    async def produce() -> str:  # a record no decoder accepts, straight onto the events topic
        producer = AIOKafkaProducer(bootstrap_servers=stack.settings.broker.bootstrap_servers)
        await producer.start()
        try:
            md = await producer.send_and_wait(stack.topics.events, f"not an event {mark}".encode(), key=b"acme|dlq")
            return f"{md.topic}:{md.partition}:{md.offset}"
        finally:
            await producer.stop()

    with ThreadPoolExecutor(1) as pool:  # Playwright's loop runs on this thread
        source = pool.submit(asyncio.run, produce()).result()
    page = _page(browser)
    _log_in(page, stack, ensure_operator_token(stack.settings).read_text().strip())
    page.wait_for_url(re.compile(r"/console/ops$"))
    deadline = time.monotonic() + WAIT_MS / 1000
    while True:
        page.goto(f"{stack.base_url}/console/ops/dead-letters")
        item = page.locator("#dead-letters li", has_text=source)
        if item.count():
            break
        assert time.monotonic() < deadline, "the record never reached the dead-letter page"
        time.sleep(1)
    reason = item.locator(".reason").inner_text()
    assert len(reason.strip()) > 10, reason  # the opened reason, one line at least
    assert item.locator(".tag").inner_text().strip()  # and the stage that refused it
    _shot(page, "dead-letters")
    page.context.close()
