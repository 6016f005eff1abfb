"""Every console page and fragment answers within the key's scope, against the real
stack (broker, worker, API): the owner sees its memory everywhere; another tenant's
key and another agent of the same user see none of it on any page or fragment, and
the operations pages refuse every key."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.interfaces.console.console_support import Written, csrf_of, login, operator_login, text_of, write_story
from tests.interfaces.iface_stack import Stack

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture(scope="module")
def story(stack: Stack) -> Written:
    return write_story(stack, "planner")


@pytest.fixture(scope="module")
def sessions(stack: Stack) -> Iterator[dict[str, httpx.Client]]:
    clients = {bank: login(stack, bank) for bank in ("planner", "spy", "globex", "trustteam")}
    yield clients
    for c in clients.values():
        c.close()


def _pages(story: Written, user: str | None) -> list[str]:
    u = f"user_id={user}&" if user else ""
    return [
        f"/console/search?{u}q=Lisbon+{story.mark}",
        f"/console/search?{u}q=Porto+{story.mark}&superseded=exclude&memory_type=episodic&k=5",
        f"/console/memories/{story.memory_id}?{u}",
        f"/console/memories/{story.old_id}?{u}",
        f"/console/ledger?{u}status=reflected",
        f"/console/ledger?{u}subject={story.subject}",
        f"/console/timeline?{u}start=2020-01-01T00:00:00&end=2030-01-01T00:00:00",
        f"/console/ledger/pending?{u}",
        "/console/spaces",
    ]


def _fragment(client: httpx.Client, path: str) -> httpx.Response:
    return client.get(path, headers={"X-Console-Fragment": "1"})


def _wait_for_decision(client: httpx.Client, story: Written) -> None:
    deadline = time.monotonic() + 60  # a readiness bound: the decision reaches the view
    while story.subject not in client.get("/console/ledger").text:
        assert time.monotonic() < deadline, "the lesson never reached the ledger page"
        time.sleep(0.5)


def test_the_owner_sees_its_memory_on_every_page(story: Written, sessions: dict[str, httpx.Client]) -> None:
    planner = sessions["planner"]
    _wait_for_decision(planner, story)
    pages = {path: planner.get(path) for path in _pages(story, None)}
    for path, resp in pages.items():
        assert resp.status_code == 200, (path, resp.text[:500])
    assert f"lives in Lisbon {story.mark}" in pages[_pages(story, None)[0]].text
    memory = pages[_pages(story, None)[2]].text
    assert f"I moved to Lisbon {story.mark}" in memory and f"before {story.mark}" in memory  # the turn and its context
    assert 'class="turn source"' in memory and "supersedes" in memory and story.old_id in memory
    assert f"lives in Lisbon {story.mark}" in pages[_pages(story, None)[3]].text  # its successor, from the old one
    assert story.subject in pages[_pages(story, None)[4]].text
    lesson = text_of(pages[_pages(story, None)[5]].text)  # its lesson, and where it goes now
    assert "yes , #1 of the 5 newest on it" in " ".join(lesson.split())
    assert f"lives in Lisbon {story.mark}" in pages[_pages(story, None)[6]].text


def test_the_owner_sees_its_pending_decision_with_its_outcome_so_far(story: Written, sessions: dict[str, httpx.Client]) -> None:
    planner = sessions["planner"]
    _wait_for_decision(planner, story)  # the settled one is in the view's ledger by now
    page = _fragment(planner, "/console/ledger/pending")
    assert page.status_code == 200 and 'data-complete="true"' in page.text and "<html" not in page.text
    rows = {text_of(r) for r in page.text.split("<tr>")[2:]}
    waiting = next(r for r in rows if story.waiting in r)
    assert f"waiting {story.mark}" in waiting and "10 trading days" in waiting
    assert f"p-{story.mark}" in waiting and "covers 3 of 10 horizon days" in waiting  # why it did not settle it
    assert not any(story.subject in r for r in rows)  # settled in the view: no longer pending
    whole = planner.get("/console/ledger/pending")  # without the script: a whole page
    assert "<html" in whole.text and story.waiting in whole.text


def test_a_source_turn_shows_amid_a_session_stamped_with_one_time(stack: Stack, sessions: dict[str, httpx.Client]) -> None:
    # LoCoMo stamps every turn of a session with the session's date: time alone cannot
    # place the cited turn among its neighbours, the log order does
    mark = uuid.uuid4().hex[:8]
    h = stack.headers("planner")
    with httpx.Client(base_url=stack.base_url, timeout=60) as c:
        turns = [{"content": f"turn {i} {mark}", "message_id": f"t{i}-{mark}", "role": "user",
                  "occurred_at": "2026-02-01T10:00:00Z"} for i in range(6)]
        r = c.post("/v1/messages", headers=h, json={"session_id": f"s-{mark}", "messages": turns})
        assert r.status_code == 202, r.text
        m = c.post("/v1/memories", headers=h, json={"content": f"cites turn 4 {mark}", "source_message_ids": [f"t4-{mark}"],
                                                     "session_id": f"s-{mark}"})
        assert m.status_code == 202, m.text
        got = c.get(f"/v1/memories/{m.json()['memory_id']}", headers=h,
                    params={"min_position": [r.json()["position"], m.json()["position"]], "wait_s": 20})
        assert got.status_code == 200, got.text
    page = sessions["planner"].get(f"/console/memories/{m.json()['memory_id']}")
    shown = [text_of(t).split(f" {mark}")[0].split()[-2:] for t in page.text.split('<li class="turn')[1:]]
    assert shown == [["turn", "2"], ["turn", "3"], ["turn", "4"], ["turn", "5"]], shown
    assert f"turn 4 {mark}" in text_of(page.text.split('class="turn source"')[1].split("</li>")[0])


@pytest.mark.parametrize("bank, user", [("spy", None), ("spy", "u1"), ("globex", None), ("globex", "u1")])
def test_other_keys_never_see_it_on_any_page(
    story: Written, sessions: dict[str, httpx.Client], bank: str, user: str | None
) -> None:
    # spy: another agent of the same user; globex: another tenant (naming the space or not);
    # the pending fragment is asked twice: as a whole page and as the script's fragment
    _seen: set[str] = set()
    _wait_for_decision(sessions["planner"], story)
    for path in _pages(story, user) + [p for p in _pages(story, user) if "/pending" in p]:
        resp = sessions[bank].get(path) if path not in _seen else _fragment(sessions[bank], path)
        _seen.add(path)
        assert resp.status_code in (200, 403, 404), (path, resp.status_code)
        text = text_of(resp.text)
        # a page may echo what was asked (a 404's id, a filter's subject), never what was written
        assert not any(s in text for s in story.secrets if s not in path), (bank, path)
        if bank == "globex" and user == "u1" and path != "/console/spaces":
            assert resp.status_code == 403, path  # another team's space, named
        if "/memories/" in path and not (bank == "globex" and user):
            assert resp.status_code == 404, path


def test_a_team_key_sees_the_space_and_not_another_team(story: Written, sessions: dict[str, httpx.Client]) -> None:
    team = sessions["trustteam"]
    assert "trust/u1" in team.get("/console/spaces").text
    assert story.mark in team.get(f"/console/memories/{story.memory_id}?user_id=u1").text
    assert "trust/u1" not in sessions["globex"].get("/console/spaces").text


def test_operations_pages_refuse_every_key(stack: Stack, sessions: dict[str, httpx.Client]) -> None:
    paths = ["/console/ops", "/console/ops/status", "/console/ops/dead-letters", "/console/ops/forget",
             "/console/ops/forget/status?team=trust&user=u1", "/console/ops/forget/status/fragment?team=trust&user=u1"]
    for bank, client in sessions.items():
        for path in paths:
            assert client.get(path).status_code == 403, (bank, path)
        resp = client.post("/console/ops/forget", data={"team": "trust", "user": "u1", "step": "confirm",
                                                       "confirm": "trust/u1", "csrf": csrf_of(client)})
        assert resp.status_code == 403, bank
    with httpx.Client(base_url=stack.base_url) as anonymous:
        for path in paths + ["/console/spaces", "/console/search?q=x"]:
            resp = anonymous.get(path)
            assert resp.status_code == 303 and resp.headers["location"] == "/console/login", path


def test_operator_pages_answer_the_operator_and_show_no_memory(stack: Stack, story: Written) -> None:
    op = operator_login(stack)
    try:
        for path in ("/console/ops", "/console/ops/status", "/console/ops/dead-letters", "/console/ops/forget"):
            resp = op.get(path)
            assert resp.status_code == 200, (path, resp.text[:300])
        # the operator token is no key: no memory space opens with it
        assert op.get(f"/console/memories/{story.memory_id}?user_id=u1").status_code == 303
    finally:
        op.close()


def test_posts_need_the_csrf_token(stack: Stack) -> None:
    with httpx.Client(base_url=stack.base_url) as c:
        c.get("/console/login")
        assert c.post("/console/login", data={"credential": stack.keys["planner"], "csrf": "x" * 43}).status_code == 403
        assert c.post("/console/login", data={"credential": stack.keys["planner"]}).status_code == 403
        ok = c.post("/console/login", data={"credential": stack.keys["planner"], "csrf": csrf_of(c)})
        assert ok.status_code == 303
        assert c.post("/console/logout", data={}).status_code == 403
        assert c.get("/console/spaces").status_code == 200


def test_login_refuses_an_unknown_key_and_sets_strict_httponly_cookies(stack: Stack) -> None:
    with httpx.Client(base_url=stack.base_url) as c:
        c.get("/console/login")
        bad = c.post("/console/login", data={"credential": "msk_nope", "csrf": csrf_of(c)})
        assert bad.status_code == 401 and "unknown API key" in bad.text
        ok = c.post("/console/login", data={"credential": stack.keys["planner"], "csrf": csrf_of(c)})
        cookie = ok.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/console" in cookie


def test_bad_form_values_are_4xx_with_a_line(stack: Stack, sessions: dict[str, httpx.Client]) -> None:
    planner = sessions["planner"]
    for path in ("/console/search?q=x&k=0", "/console/search?q=x&time_from=yesterday", "/console/ledger?status=nope",
                 "/console/timeline?start=2026-01-02&end=2026-01-01", "/console/timeline?after=nope", "/console/ledger?dpage=0",
                 "/console/memories/a%7Cb", "/console/search?q=x&agent_id=a%7Cb"):
        resp = planner.get(path)
        assert 400 <= resp.status_code < 500, (path, resp.status_code)
        assert 'role="alert"' in resp.text, path
