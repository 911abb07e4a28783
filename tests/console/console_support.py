"""Helpers of the console tests: a console on the test's stage, Debian's chromium, HTTP."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from conftest import Stack
from playwright.sync_api import Browser, Page, sync_playwright

from agentq.config import Settings
from agentq.console import ConsoleOptions, ConsoleServer
from agentq.definitions import DefinitionsTable, TaskDefinition

CHROMIUM: Final = Path("/usr/bin/chromium")
# Flags that work in a container without a display, a GPU or network to Google.
LAUNCH_ARGS: Final = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# Module scope: Playwright's sync API keeps an asyncio loop running in this thread while
# it is open, and later modules (the model server's CLI tests) run loops of their own.
@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail("Debian's chromium is missing: run `make browser`")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=LAUNCH_ARGS
        )
        yield launched
        launched.close()


@contextlib.contextmanager
def running_console(
    *, allow_actions: bool = False, refresh_ms: int = 300
) -> Iterator[ConsoleServer]:
    """A console on the stage the environment names (the `stack` fixture sets it)."""
    options = ConsoleOptions(allow_actions=allow_actions, refresh_ms=refresh_ms)
    server = ConsoleServer.from_settings(Settings.from_env(), options).start()
    try:
        yield server
    finally:
        server.stop()


def signed_in(browser: Browser, server: ConsoleServer) -> Page:
    """A fresh browser context that opened the printed URL (so it holds the cookie)."""
    page = browser.new_context().new_page()
    page.goto(server.url)
    page.wait_for_selector("body[data-drawn='1']")
    return page


def define(stack: Stack, *names: str) -> None:
    table = DefinitionsTable(stack.dynamodb, stack.resources.definitions_table)
    for name in names:
        table.put(TaskDefinition(name=name, kind="python"))


@dataclass
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()

    def json(self) -> Any:
        return json.loads(self.body)


class Http:
    """Raw HTTP to a console, so tests choose every header (Host, Origin, cookies)."""

    def __init__(self, server: ConsoleServer) -> None:
        self.server = server
        self.cookie: str | None = None

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        cookie: bool = True,
    ) -> Reply:
        connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        sent = {"Host": f"127.0.0.1:{self.server.port}", **(headers or {})}
        if cookie and self.cookie:
            sent["Cookie"] = self.cookie
        try:
            connection.request(method, path, body=body, headers=sent)
            response = connection.getresponse()
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()},
                         response.read())  # fmt: skip
        finally:
            connection.close()

    def sign_in(self) -> Reply:
        reply = self.request("GET", f"/jobs?token={self.server.parts.gate.token}", cookie=False)
        assert reply.status == 303, reply
        self.cookie = reply.headers["set-cookie"].split(";", 1)[0]
        return reply

    def csrf(self) -> str:
        page = self.request("GET", "/dlq")
        found = re.search(r'name="csrf-token" content="([0-9a-f]+)"', page.text)
        assert found, page.text[:500]
        return found.group(1)

    def nonce(self, path: str = "/jobs") -> str:
        """The form nonce a freshly served page carries (one per page served)."""
        page = self.request("GET", path)
        found = re.search(r'name="form-nonce" content="([A-Za-z0-9_-]+)"', page.text)
        assert found, page.text[:500]
        return found.group(1)

    def act(self, name: str, payload: Mapping[str, Any], *, csrf: str | None,
            content_type: str = "application/json", origin: str | None = None) -> Reply:  # fmt: skip
        headers = {"Content-Type": content_type}
        if csrf is not None:
            headers["X-CSRF-Token"] = csrf
        if origin is not None:
            headers["Origin"] = origin
        return self.request("POST", f"/api/actions/{name}", body=json.dumps(payload).encode(),
                            headers=headers)  # fmt: skip
