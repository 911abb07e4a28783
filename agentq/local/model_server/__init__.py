"""Offline stand-in for the Anthropic Messages API (a development fake, like moto; not a model).

The Claude Code CLI that ships inside ``claude-agent-sdk`` honours ``ANTHROPIC_BASE_URL``.
Pointed at this server it runs complete agent sessions with no network: every answer is
computed deterministically from the request. See ``docs/model-server.md`` for the long form.

Endpoints
---------
``POST /v1/messages``
    Streaming (SSE) when the body has ``"stream": true``, plain JSON otherwise.
``POST /v1/messages/count_tokens``
    ``{"input_tokens": <len(body) // 4>}``.
``GET /v1/models``, ``GET /``, ``GET /health``, ``HEAD *``
    Small sensible answers for probes. Anything else: 404 with the Anthropic error shape.

Default behaviour (no script)
-----------------------------
* If the request offers a ``StructuredOutput`` tool (what the CLI does for
  ``output_format={"type": "json_schema", ...}``) and the conversation has no accepted
  ``StructuredOutput`` call yet, the answer is a ``tool_use`` of ``StructuredOutput`` whose input
  is generated from the tool's ``input_schema`` by :func:`generate_value` (schema-valid,
  deterministic, strings mention the prompt). Once its ``tool_result`` came back without
  ``is_error``, the answer is a short final text (``end_turn``).
* Without ``StructuredOutput`` the answer is a deterministic text (``end_turn``).
* Usage (``input_tokens``, ``output_tokens``, ``cache_read_input_tokens``,
  ``cache_creation_input_tokens``) is derived from the request size, see :func:`compute_usage`.
  Each request's numbers are kept in :attr:`ModelServer.request_log`.

Scenario grammar (markers in the prompt)
----------------------------------------
Markers may appear in any user text block or in the system prompt::

    [[model: DIRECTIVE; DIRECTIVE; ...]]

Several markers in one prompt add up. Directives (``N`` is an integer)::

    key NAME                       scenario key for counting (default: the marker text itself)
    fail STATUS [xN] [turn N] [retry-after SECONDS] [no-retry]
                                   answer HTTP STATUS (e.g. 401, 429, 500, 529) with the Anthropic
                                   error body. ``xN``: only the first N requests of this scenario key
                                   (counted server-wide, so across CLI processes); without ``xN``
                                   every time. Several ``fail`` directives are used in order
                                   (``fail 429 x1; fail 529 x1`` = 429, then 529, then success).
                                   ``turn N``: only requests whose conversation already has N
                                   assistant turns (counted per key and turn). ``retry-after``
                                   sets that header; ``no-retry`` sends ``x-should-retry: false``.
    stall [midstream] [xN] [turn N]
                                   hold the connection without answering until the server stops
                                   (``midstream``: after sending ``message_start``).
    delay MS[ms|s] [turn N]        wait before answering (interrupted by server stop).
    output JSON [xN]               StructuredOutput input to send instead of the generated one
                                   (may violate the schema). ``xN``: only for the first N
                                   StructuredOutput calls of the conversation.
    tool NAME JSON                 call tool NAME with input JSON before the final answer; several
                                   ``tool`` directives are called one per turn, in order.
    text TEXT                      final text (bare words up to ``;`` or a JSON string).
    usage input=N output=N cache_read=N cache_creation=N
                                   fixed usage numbers instead of the derived ones.

Example: ``Summarise the file [[model: key retry-demo; fail 429 x2; tool Bash {"command": "ls"}]]``.

Script file (``--script FILE`` or ``ModelServer(script=...)``)
--------------------------------------------------------------
JSON or YAML: ``{"rules": [RULE, ...]}`` or a bare list of rules. The first rule whose ``match``
(a substring of the prompt/system text; omitted = every request) matches applies; markers in the
prompt are added on top of it (a marker ``key`` wins). A rule has ``match``, ``key`` (default:
``match``, else ``rule<index>``), ``do`` (a directive string in the grammar above) and/or the
structured fields ``fail`` (mapping or list of mappings: ``status``, ``times``, ``turn``,
``retry_after``, ``no_retry``), ``stall`` (true or ``"midstream"``), ``delay_ms``, ``output``,
``output_times``, ``tools`` (list of ``{name, input}``), ``text``, ``usage`` (mapping with
``input_tokens``, ``output_tokens``, ``cache_read_input_tokens``,
``cache_creation_input_tokens``).

Run: ``python -m agentq.local.model_server --port 0 [--script FILE]`` prints the URL and serves
until SIGINT/SIGTERM.

Layout: ``scenario`` (the model of a scripted request), ``grammar`` (markers), ``script``
(rule files), ``values`` and ``pattern`` (schema-valid values), ``request`` (reading a
request, planning the answer), ``http_handler`` (routes, JSON and SSE), ``server``
(``ModelServer`` and the command line).
"""

from agentq.local.model_server.grammar import parse_directives, parse_markers
from agentq.local.model_server.request import compute_usage
from agentq.local.model_server.scenario import (
    STRUCTURED_OUTPUT_TOOL,
    Failure,
    RequestRecord,
    Rule,
    Scenario,
    ScriptError,
    ToolCall,
)
from agentq.local.model_server.script import load_script
from agentq.local.model_server.server import ModelServer, main
from agentq.local.model_server.values import generate_value

__all__ = [
    "STRUCTURED_OUTPUT_TOOL",
    "Failure",
    "ModelServer",
    "RequestRecord",
    "Rule",
    "Scenario",
    "ScriptError",
    "ToolCall",
    "compute_usage",
    "generate_value",
    "load_script",
    "main",
    "parse_directives",
    "parse_markers",
]
