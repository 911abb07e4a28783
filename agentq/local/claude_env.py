"""Environment for running the bundled Claude Code CLI against the offline model server.

The Claude Agent SDK starts the CLI with ``os.environ`` *plus* ``ClaudeAgentOptions.env``, so
the dict returned here is meant for ``ClaudeAgentOptions(env=...)`` (or to update a child
process environment). Variables that could send the CLI elsewhere are set to ``""``, which the
CLI treats as unset, so an ambient value in the parent process cannot leak in.

Facts behind it (CLI 2.1.x bundled with claude-agent-sdk 0.2.18x, checked with strace: with
these variables the CLI opens no socket except the one to ``base_url``):

* A fresh ``HOME`` costs nothing extra: the first run in an empty home took 0.8-1.4 s,
  the same as later runs (the CLI writes ``$CLAUDE_CONFIG_DIR/.claude.json``, ``projects/``,
  ``sessions/``, ``plugins/``, ``backups/``). No pre-seeded config is needed. A run right after
  the 370 MB binary was evicted from the page cache took ~4.9 s.
* On 401/429/5xx/529 the CLI retries by itself: 10 retries by default, exponential backoff
  from ~0.5 s doubling with jitter up to ~35 s per wait (an always-failing request takes
  ~3 minutes), honouring ``retry-after`` when it is longer than the backoff and giving up at
  once on ``x-should-retry: false``. ``CLAUDE_CODE_MAX_RETRIES`` sets the number of retries.
* A stalled request is only abandoned after ``API_TIMEOUT_MS`` (default 600 000 ms); it is
  then retried like a 5xx.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["offline_claude_env"]

#: Variables that would make the CLI use another credential, provider or model.
_NEUTRALISED = (
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
    "CLAUDE_CODE_USE_FOUNDRY",
    "ANTHROPIC_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "ANTHROPIC_CUSTOM_HEADERS",
)


def offline_claude_env(
    base_url: str,
    home: Path,
    *,
    api_key: str = "test-key",
    max_retries: int | None = None,
    api_timeout_ms: int | None = None,
) -> dict[str, str]:
    """Return the environment a CLI child needs to talk only to the server at ``base_url``.

    ``home`` (and ``home/.claude``) are created if missing; the CLI must be able to write there.

    Variables:

    * ``ANTHROPIC_BASE_URL`` - where the CLI sends ``POST /v1/messages`` (the model server).
    * ``ANTHROPIC_API_KEY`` - any value; the CLI sends it as ``x-api-key`` (the model server
      does not check it; script ``fail 401`` to test authentication errors).
    * ``HOME`` - the CLI writes its state under the home directory; a temp dir per test or per
      worker keeps runs independent and never touches the developer's real ``~/.claude``.
    * ``CLAUDE_CONFIG_DIR`` - ``home/.claude``; set explicitly so an inherited value cannot
      point the CLI at another config (``.claude.json``, sessions, settings, plugins).
    * ``XDG_CONFIG_HOME``, ``XDG_CACHE_HOME``, ``XDG_DATA_HOME``, ``XDG_STATE_HOME`` - under
      ``home`` too, so no cache or state is written outside it.
    * ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`` - no telemetry, error reporting, feature
      flag fetches, update checks or release notes: the CLI makes no outbound connection
      besides the API, so nothing waits on an unreachable network.
    * ``DISABLE_AUTOUPDATER``, ``DISABLE_TELEMETRY``, ``DISABLE_ERROR_REPORTING`` - the
      individual switches behind the previous one (kept for older CLI versions).
    * ``ANTHROPIC_AUTH_TOKEN``, ``CLAUDE_CODE_OAUTH_TOKEN``, ``CLAUDE_CODE_USE_BEDROCK``,
      ``CLAUDE_CODE_USE_VERTEX``, ``CLAUDE_CODE_USE_FOUNDRY``, ``ANTHROPIC_MODEL``,
      ``ANTHROPIC_SMALL_FAST_MODEL``, ``ANTHROPIC_CUSTOM_HEADERS`` - set to ``""`` (treated as
      unset) because the SDK passes the parent's environment through.
    * ``CLAUDE_CODE_MAX_RETRIES`` - only if ``max_retries`` is given: how many times the CLI
      itself retries 401/429/5xx/529 (default 10 with backoff up to ~35 s; 0 = fail at once).
    * ``API_TIMEOUT_MS`` - only if ``api_timeout_ms`` is given: per-request timeout after
      which the CLI abandons (and retries) a request that gets no answer (default 600 000).
    """
    home = Path(home)
    config_dir = home / ".claude"
    config_dir.mkdir(parents=True, exist_ok=True)
    env: dict[str, str] = {
        "ANTHROPIC_BASE_URL": base_url.rstrip("/"),
        "ANTHROPIC_API_KEY": api_key,
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(config_dir),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }
    env.update(dict.fromkeys(_NEUTRALISED, ""))
    if max_retries is not None:
        env["CLAUDE_CODE_MAX_RETRIES"] = str(max_retries)
    if api_timeout_ms is not None:
        env["API_TIMEOUT_MS"] = str(api_timeout_ms)
    return env
