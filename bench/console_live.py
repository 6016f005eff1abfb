"""Every console page against a running memstream holding LoCoMo's conversations
(the data of ``memstream bench locomo``), in the system's chromium.

1. the conversations' turns go in through ``POST /v1/messages`` (one space per
   conversation, as ``bench locomo`` makes them, team ``locomo-bench``), plus one
   decision an outcome settles and one still pending in the first space (LoCoMo has
   none); the run waits until the worker has extracted and projected them;
2. a team-wide key opens the spaces page, then for each conversation: a search (one
   of its LoCoMo questions), the first result's story (its source turn highlighted),
   the ledger with its pending fragment, and the timeline over the conversation's
   dates, then a page deep in it by the cursor; a key pinned to the first space must
   get a 403 on another's; the operator opens the operations, dead-letter and forget
   pages and forgets the last conversation until every shard applied it.

Each check prints one line; any failure exits non-zero. The data is read in place
(its licence is non-commercial: nothing of it is written into the repository)::

    python -m memstream.bench.console_live --url http://127.0.0.1:8080 \\
        --data ../shared/bench/locomo/locomo-dev5.json --key msk_... --pinned-key msk_... \\
        --operator-token-file $MEMSTREAM_HOME/operator.token
"""

from __future__ import annotations

import argparse
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import httpx
from playwright.sync_api import sync_playwright

from memstream.bench.locomo import TEAM, Conversation, load_locomo, scope_of

__all__ = ["load", "decide", "check"]

_WAIT_S = 600.0  # readiness bound on a loaded machine: the worker embeds every turn


def _post(c: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = c.post(path, json=body)
    if r.status_code not in (200, 202):
        raise SystemExit(f"{path}: {r.status_code} {r.text}")
    return r.json()  # type: ignore[no-any-return]


def load(url: str, key: str, conversations: list[Conversation]) -> None:
    """Send every turn (session by session), then two decisions in the first space, and
    wait until each space's turns are searchable and its memory count holds still."""
    with httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {key}"}) as c:
        for conv in conversations:
            scope = {"user_id": scope_of(conv).user_id}
            sessions: dict[int, list[Any]] = {}
            for t in conv.turns:
                sessions.setdefault(t.session, []).append(t)
            for n, turns in sessions.items():
                _post(c, "/v1/messages", {"scope": scope, "session_id": f"session_{n}", "messages": [
                    {"message_id": t.dia_id, "speaker": t.speaker, "content": t.text, "occurred_at": t.occurred_at.isoformat()}
                    for t in turns]})
    decide(url, key, scope_of(conversations[0]).user_id)
    with httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {key}"}) as c:
        for conv in conversations:
            _settled(c, scope_of(conv).user_id, conv.turns[-1].text)


def decide(url: str, key: str, user: str) -> None:
    """A decision an outcome settles (the reflector writes its lesson) and one whose
    outcome covers 3 of its 20 days (it stays pending)."""
    scope = {"team_id": TEAM, "user_id": user}
    with httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {key}"}) as c:
        for did, horizon, days in (("live-settled", 5, 5), ("live-pending", 20, 3)):
            _post(c, "/v1/decisions", {"scope": scope, "decision_id": did, "subject": did, "rating": "hold", "horizon_days": horizon,
                                       "decision_text": f"{did}: a decision of the console's live check"})
            _post(c, "/v1/events", {"type": "OutcomeObserved", "schema_version": 1, "scope": scope, "outcome_id": f"{did}-o",
                                    "subject": did, "raw_return": 0.02, "horizon_days": days, "decision_id": did})


def _settled(c: httpx.Client, user: str, last_turn: str) -> None:
    """Waits until the space's last turn is found by search and the count of its
    memories stopped moving for 10 s (the extractor writes them after the turns)."""
    deadline, seen, still_since = time.monotonic() + _WAIT_S, -1, time.monotonic()
    while time.monotonic() < deadline:
        r = c.get("/v1/search", params={"q": last_turn, "user_id": user, "k": 100})
        n = len(r.json()["results"]) if r.status_code == 200 else -1
        if n != seen:
            seen, still_since = n, time.monotonic()
        elif n > 0 and time.monotonic() - still_since > 10:
            return
        time.sleep(2)
    raise SystemExit(f"{user}: the worker did not catch up in {_WAIT_S:.0f} s")


@contextmanager
def _session(browser: Any, url: str, credential: str) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(f"{url}/console/login")
    page.get_by_label("API key or operator token").fill(credential)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_load_state()
    try:
        yield page
    finally:
        context.close()


def _open(page: Any, url: str, path: str, must: str, where: str = "main") -> str:
    """Opens ``path``, fails unless it answers 200 and ``where`` holds ``must``."""
    resp = page.goto(url + path)
    text = page.locator(where).inner_text()
    if resp is None or resp.status != 200 or must not in text:
        raise SystemExit(f"FAIL {path}: {resp.status if resp else '?'}; wanted {must!r} in {where}:\n{text[:600]}")
    print(f"ok   {path[:110]}")
    return text


def _space(page: Any, url: str, conv: Conversation) -> None:
    user = quote_plus(scope_of(conv).user_id)
    question = next(q for q in conv.qa if q.category != 5).question
    _open(page, url, f"/console/search?user_id={user}&q={quote_plus(question)}", "result(s)", "#results")
    first = page.locator(".result a.content").first
    if not first.count():
        raise SystemExit(f"FAIL search in {user}: no result for {question!r}")
    first.click()
    page.wait_for_url(re.compile(r"/console/memories/"))
    source = page.locator(".turn.source")
    if not source.count() or not source.first.inner_text().strip():
        raise SystemExit(f"FAIL {page.url}: no source turn highlighted")
    print(f"ok   {page.url.split('/console', 1)[1][:110]} (source turn: {source.first.inner_text().strip()[:50]!r})")
    page.goto(f"{url}/console/ledger?user_id={user}")
    page.wait_for_selector("#pending-state")
    print(f"ok   /console/ledger?user_id={user} (pending: {page.locator('#pending-state').inner_text().strip()[:60]!r})")
    days = sorted(t.occurred_at for t in conv.turns)
    window = f"user_id={user}&start={days[0].date()}T00:00:00&end={days[-1].date()}T23:59:59"
    _open(page, url, f"/console/timeline?{window}", "memory", "#events")
    older = page.get_by_role("link", name="Older", exact=True)
    if older.count():
        older.first.click()
        page.wait_for_load_state()
        if "memory" not in page.locator("#events").inner_text():
            raise SystemExit(f"FAIL {page.url}: the next timeline page is empty")
        print(f"ok   {page.url.split('/console', 1)[1][:110]} (the next page, by the cursor)")


def check(url: str, key: str, pinned_key: str, operator_token: str, chromium: str, conversations: list[Conversation]) -> None:
    users = [scope_of(c).user_id for c in conversations]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox", "--disable-gpu"])
        with _session(browser, url, key) as page:
            spaces = _open(page, url, "/console/spaces", users[0])
            missing = [u for u in users if u not in spaces]
            if missing:
                raise SystemExit(f"FAIL /console/spaces: {missing} not listed")
            for conv in conversations:
                _space(page, url, conv)
            page.goto(f"{url}/console/ledger?user_id={quote_plus(users[0])}")
            page.wait_for_function("document.querySelector('#lessons') && document.body.innerText.includes('live-settled')")
            if "live-pending" not in page.locator("#pending").inner_text():
                raise SystemExit("FAIL /console/ledger: the pending decision is not listed")
            print("ok   /console/ledger: the settled decision's lesson and the pending decision with its outcome so far")
        with _session(browser, url, pinned_key) as page:
            for other in users[1:]:
                resp = page.goto(f"{url}/console/search?user_id={quote_plus(other)}&q=hello")
                if resp is None or resp.status != 403:
                    raise SystemExit(f"FAIL a key pinned to {users[0]} opened {other}'s search: {resp.status if resp else '?'}")
            print(f"ok   a key pinned to {users[0]}: 403 on the {len(users) - 1} other spaces")
        with _session(browser, url, operator_token) as page:
            _open(page, url, "/console/ops", "Records not yet projected")
            _open(page, url, "/console/ops/dead-letters", "Dead letters")
            _open(page, url, "/console/ops/forget", "Forget")
            gone = users[-1]
            page.get_by_label("Team", exact=True).fill(TEAM)
            page.get_by_label("User (empty: every user of the team)").fill(gone)
            page.get_by_role("button", name="Review").click()
            page.get_by_label(f"Type {TEAM}/{gone} to confirm").fill(f"{TEAM}/{gone}")
            page.get_by_role("button", name=f"Forget {TEAM}/{gone}").click()
            page.wait_for_selector('#forget-state[data-complete="true"]', timeout=_WAIT_S * 1000)
            print(f"ok   /console/ops/forget: {TEAM}/{gone} forgotten, every shard applied it")
        browser.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--data", type=Path, required=True, help="LoCoMo JSON, read in place.")
    ap.add_argument("--key", required=True, help=f"A key of a bank of team {TEAM} (team-wide: every conversation).")
    ap.add_argument("--pinned-key", required=True, help="A key of a bank pinned to the first conversation's user.")
    ap.add_argument("--operator-token-file", type=Path, required=True)
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser") or "chromium")
    ap.add_argument("--no-write", action="store_true", help="The conversations are loaded already.")
    args = ap.parse_args()
    conversations = load_locomo(args.data)
    if not args.no_write:
        t0 = time.monotonic()
        load(args.url, args.key, conversations)
        print(f"loaded {sum(len(c.turns) for c in conversations)} turns of {len(conversations)} conversations "
              f"in {time.monotonic() - t0:.0f} s")
    check(args.url, args.key, args.pinned_key, args.operator_token_file.read_text().strip(), args.chromium, conversations)


if __name__ == "__main__":
    main()
