"""`agentq console` as an operator runs it: a child process printing its URL."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from conftest import Stack
from support import wait_for

pytestmark = pytest.mark.timeout(120)


def test_agentq_console_prints_a_token_url_that_opens_and_stops_on_ctrl_c(stack: Stack) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "agentq.cli", "console", "--allow-actions"],
        env={**os.environ, **stack.env()},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines: list[str] = []

        def url() -> str | None:
            lines.append(process.stdout.readline())  # type: ignore[union-attr]
            found = re.search(r"(http://127\.0\.0\.1:\d+/jobs\?token=[\w-]+)", "".join(lines))
            return found.group(1) if found else None

        address = wait_for(url, timeout=60, message="the console's URL")
        assert "actions allowed" in "".join(lines)
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with browser.open(address) as opened:  # the redirect sets the cookie
            assert opened.status == 200
            assert opened.url.endswith("/jobs") and "Jobs" in opened.read().decode()
        base = address.split("/jobs", 1)[0]
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + "/jobs?token=wrong")
        assert refused.value.code == 403
    finally:
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=30)
    assert code == 0, process.stderr.read() if process.stderr else ""
