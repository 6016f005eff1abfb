"""The README's console screenshots, from a running memstream and data written here:
a short synthetic support conversation (a customer changes her billing address and
asks about more seats), memories citing its turns, a supersession, a settled decision
with its lesson and one still pending. No third-party data: LoCoMo's licence is
non-commercial, so it never appears in the repository's images.

    python -m memstream.bench.console_shots --url http://127.0.0.1:8080 \\
        --key msk_... --operator-token-file .memstream/operator.token --out docs/console

``--key``: a key of a bank pinned to one user (e.g. team ``acme-support``, user
``northwind-dana``). Needs Playwright for Python and the system's chromium (``--chromium``).
"""

from __future__ import annotations

import argparse
import shutil
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import sync_playwright

__all__ = ["write_conversation", "shoot"]

SESSION = "ticket-4812"
TURNS = [
    ("user", "Dana", "Hi, I'm Dana from Northwind Bakery. Our invoices keep going to my old address, dana@oldmail.example."),
    ("assistant", "Support", "Sorry about that, Dana. Which address should invoices go to from now on?"),
    ("user", "Dana", "Please send them to billing@northwind.example. That's our shared billing inbox."),
    ("assistant", "Support", "Done: invoices now go to billing@northwind.example."),
    ("user", "Dana", "Also, we have three stores now, so we probably need more seats on the team plan."),
    ("assistant", "Support", "I can suggest the Pro plan with ten seats; shall I prepare a quote?"),
    ("user", "Dana", "Yes, but I prefer to talk by email, not phone. Mornings are best."),
]
MEMORIES = [
    ("inv-old", "Dana wants invoices sent to dana@oldmail.example", "work_fact", "sup-0", 50),
    ("inv-new", "Dana wants invoices sent to billing@northwind.example (the shared billing inbox)", "work_fact", "sup-2", 60),
    ("pref-email", "Dana prefers email over phone, ideally in the morning", "persona", "sup-6", 80),
    ("stores-3", "Northwind Bakery now has three stores and may need more seats", "work_fact", "sup-4", 50),
]
LINKS = [
    ("inv-new", "inv-old", "supersedes", "Dana gave a new billing address"),
    ("stores-3", "pref-email", "same_entity", "both about Northwind Bakery"),
]


def _post(c: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = c.post(path, json=body)
    if r.status_code != 202:
        raise SystemExit(f"{path}: {r.status_code} {r.text}")
    return r.json()  # type: ignore[no-any-return]


def write_conversation(url: str, key: str) -> None:
    """The conversation, its memories and links, one decision an outcome settles and
    one an outcome covers only in part; returns once the view holds the memories."""
    with httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {key}"}) as c:
        msgs = [{"content": text, "message_id": f"sup-{i}", "role": role, "speaker": who,
                 "occurred_at": f"2026-11-0{3 + i // 3}T09:{10 + i:02d}:00Z"} for i, (role, who, text) in enumerate(TURNS)]
        positions = [_post(c, "/v1/messages", {"session_id": SESSION, "messages": msgs})["position"]]
        for mid, content, kind, source, priority in MEMORIES:
            positions.append(_post(c, "/v1/memories", {"content": content, "memory_id": mid, "memory_type": kind, "priority": priority,
                                                       "source_message_ids": [source], "session_id": SESSION})["position"])
        for a, b, relation, reason in LINKS:
            positions.append(_post(c, "/v1/events", {"type": "MemoryLinked", "schema_version": 1, "link_id": f"{a}-{b}",
                                                    "from_memory_id": a, "to_memory_id": b, "relation": relation,
                                                    "reason": reason})["position"])  # an id: a second run replaces it
        _post(c, "/v1/decisions", {"subject": "pro-upgrade", "rating": "buy", "horizon_days": 5, "decision_id": "dec-pro",
                                   "decision_text": "Offer Dana the Pro plan with ten seats, quoted by email in the morning."})
        _post(c, "/v1/events", {"type": "OutcomeObserved", "schema_version": 1, "outcome_id": "out-pro", "subject": "pro-upgrade",
                                "raw_return": 0.12, "horizon_days": 5, "decision_id": "dec-pro"})
        _post(c, "/v1/decisions", {"subject": "renewal-discount", "rating": "hold", "horizon_days": 20, "decision_id": "dec-renew",
                                   "decision_text": "Hold the renewal discount until the three stores are on one account."})
        _post(c, "/v1/events", {"type": "OutcomeObserved", "schema_version": 1, "outcome_id": "out-renew-wk1",
                                "subject": "renewal-discount", "raw_return": 0.01, "horizon_days": 5, "decision_id": "dec-renew"})
        r = c.get("/v1/memories/inv-new", params={"min_position": positions, "wait_s": 30})
        if r.status_code != 200:
            raise SystemExit(f"the view did not catch up: {r.status_code} {r.text}")


def _log_in(page: Any, url: str, credential: str) -> None:
    page.goto(f"{url}/console/login")
    page.get_by_label("API key or operator token").fill(credential)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_load_state()


def shoot(url: str, key: str, operator_token: str, out: Path, chromium: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    shots: list[Path] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox", "--disable-gpu"])

        def save(page: Any, name: str) -> None:
            shots.append(out / f"{name}.png")
            page.screenshot(path=str(shots[-1]), full_page=True)

        page = browser.new_context(viewport={"width": 1200, "height": 800}).new_page()
        _log_in(page, url, key)
        save(page, "spaces")
        page.goto(f"{url}/console/search?q=where+should+invoices+go")
        page.locator(".result summary").first.click()
        save(page, "search")
        page.goto(f"{url}/console/memories/inv-new")
        save(page, "memory")
        page.goto(f"{url}/console/ledger")
        deadline = time.monotonic() + 60  # the reflector writes the lesson
        while "pro-upgrade" not in page.locator("#lessons").inner_text() and time.monotonic() < deadline:
            time.sleep(1)
            page.reload()
        page.wait_for_selector("#pending-state")
        save(page, "ledger")
        now = datetime.now(timezone.utc).replace(microsecond=0, tzinfo=None)
        window = f"start={(now - timedelta(minutes=50)).isoformat()}&end={(now + timedelta(minutes=10)).isoformat()}"
        page.goto(f"{url}/console/timeline?{window}")
        save(page, "timeline")
        page.context.close()
        page = browser.new_context(viewport={"width": 1200, "height": 800}).new_page()
        _log_in(page, url, operator_token)
        save(page, "operations")
        page.goto(f"{url}/console/ops/dead-letters")
        save(page, "dead-letters")
        browser.close()
    return shots


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--key", required=True)
    ap.add_argument("--operator-token-file", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path("docs/console"))
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser") or "chromium")
    ap.add_argument("--no-write", action="store_true", help="The data is there already.")
    args = ap.parse_args()
    if not args.no_write:
        write_conversation(args.url, args.key)
    for path in shoot(args.url, args.key, args.operator_token_file.read_text().strip(), args.out, args.chromium):
        print(path)


if __name__ == "__main__":
    main()
