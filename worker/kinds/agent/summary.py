"""logs/summary.log: a human-readable account of one agent task, every line sanitized."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Final, TextIO

from agentq.security import redact_values, sanitize_error_message

# Secret values the child can see; they must never reach a log line, whatever shape
# they have (an OAuth token matches no pattern).
SECRET_ENV: Final = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN")
MAX_CLI_LOG: Final = 256 * 1024


def known_secrets() -> list[str]:
    return [os.environ[name] for name in SECRET_ENV if os.environ.get(name)]


def clean(text: str) -> str:
    return sanitize_error_message(redact_values(str(text), known_secrets()))


class SummaryLog:
    """Appends sanitized lines to logs/summary.log and mirrors them to stderr."""

    def __init__(self, path: Path, *, echo: TextIO | None = sys.stderr) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._echo = echo
        self._file = path.open("a", encoding="utf-8")

    def line(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.gmtime())
        for part in clean(text).splitlines() or [""]:
            entry = f"{stamp} {part}"
            self._file.write(entry + "\n")
            if self._echo is not None:
                self._echo.write(f"[agent] {entry}\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class CliLog:
    """The CLI's stderr → logs/cli.log (sanitized, bounded): kept for debugging a run."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")
        self._written = 0

    def __call__(self, line: str) -> None:
        if self._written > MAX_CLI_LOG:
            return
        text = clean(line.rstrip("\n")) + "\n"
        self._written += len(text)
        self._file.write(text)
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def describe_totals(totals: dict[str, Any], cache_pct: float) -> list[str]:
    usage = totals["usage"]
    return [
        f"turns {totals['num_turns']}, duration {totals['duration_ms']} ms, "
        f"cost ${totals['cost_usd']:.4f}",
        f"tokens: input {usage['input_tokens']}, output {usage['output_tokens']}, "
        f"cache read {usage['cache_read_input_tokens']}, "
        f"cache write {usage['cache_creation_input_tokens']} "
        f"(cache efficiency {cache_pct:.1f}%)",
    ]


def describe_tools(summary: dict[str, dict[str, Any]]) -> str:
    if not summary:
        return "tool calls: none"
    parts = [
        f"{name} x{entry['calls']} ({entry['total_ms']:.0f} ms"
        + (f", {entry['errors']} failed)" if entry["errors"] else ")")
        for name, entry in sorted(summary.items())
    ]
    return "tool calls: " + ", ".join(parts)
