"""The dead-letter listing stays bounded however many letters an incident archives:
the newest MAX_SHOWN are fetched and shown with the total, and only their rows (bodies
cut to the preview) are kept between refreshes. Against moto's S3."""

from __future__ import annotations

import pytest
from conftest import Stack
from console_support import browser, running_console, signed_in
from playwright.sync_api import Browser

from agentq.console import deadletters
from agentq.console.deadletters import BODY_PREVIEW, DeadLetters
from agentq.dlq import ArchivedMessage, DlqArchive, archive_key

pytestmark = pytest.mark.timeout(60)
__all__ = ["browser"]  # a fixture, used by its name


def _letter(index: int, body: str = "{}") -> ArchivedMessage:
    request_id = f"dl-{index}"
    return ArchivedMessage(
        key=archive_key("acme", request_id, f"m-{index}"), message_id=f"m-{index}",
        request_id=request_id, tenant="acme", body=body, attributes={},
        system_attributes={}, archived_at_ms=1_000 + index, outcome="malformed",
    )  # fmt: skip


def test_the_newest_letters_are_shown_with_the_total_and_only_rows_are_kept(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deadletters, "MAX_SHOWN", 3)
    archive = DlqArchive(stack.s3, stack.resources.bucket)
    for index in range(5):
        archive.put(_letter(index, body="x" * 200_000))
    fetched: list[str] = []
    get = archive.get

    def counted_get(key: str) -> ArchivedMessage:
        fetched.append(key)
        return get(key)

    monkeypatch.setattr(archive, "get", counted_get)
    letters = DeadLetters(stack.s3, archive)

    listed = letters.list()

    assert listed["total"] == 5 and len(listed["letters"]) == 3
    assert len(fetched) == 3  # the two not shown were never read
    archived = [row["archivedMs"] for row in listed["letters"]]
    assert archived == sorted(archived, reverse=True)
    assert all(len(row["body"]) == BODY_PREVIEW and row["bodyTruncated"]
               for row in listed["letters"])  # fmt: skip
    # Between refreshes only the rows are kept, not the 200 KB letters.
    kept = sum(len(row["body"]) for _, row in letters._known.values())
    assert kept == 3 * BODY_PREVIEW
    # A refresh with nothing new written fetches nothing again.
    assert letters.list() == listed and len(fetched) == 3


def test_the_page_says_how_many_letters_it_does_not_show(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, browser: Browser
) -> None:
    monkeypatch.setattr(deadletters, "MAX_SHOWN", 2)
    archive = DlqArchive(stack.s3, stack.resources.bucket)
    for index in range(3):
        archive.put(_letter(index, body='{"x": "<img src=x onerror=alert(1)>"}'))
    with running_console() as console:
        page = signed_in(browser, console)
        page.goto(f"{console.base_url}/dlq")
        page.wait_for_selector("#dlq-shown")
        assert page.inner_text("#dlq-shown").startswith("showing the newest 2 of 3")
        assert page.locator("#letters tbody tr").count() == 2
        # A body is text on the page, never markup.
        assert page.locator("#letters img").count() == 0
