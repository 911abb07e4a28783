"""The console's web application (Starlette): pages, their JSON, actions.

Each page is a small HTML shell with its data embedded as JSON (so the first drawing
needs no second request) plus the console's own scripts, which draw everything with
DOM text nodes and then poll the page's JSON with `If-None-Match`: an unchanged page
costs the browser a 304 and draws nothing. Endpoints are plain functions, which
Starlette runs in its thread pool, so boto3's blocking calls never stall the loop.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import jinja2
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from agentq.console.actions import Actions
from agentq.console.deadletters import DeadLetters
from agentq.console.jobtasks import TasksUnreadable
from agentq.console.operations import Operations
from agentq.console.reads import (
    JOB_STATES,
    ConsoleReader,
    job_state_filter,
    page_size,
    validate_tenant,
)
from agentq.console.search import TASK_STATES, parse_filters
from agentq.console.security import Gate, GateMiddleware
from agentq.errors import AgentqError, InvalidInput, NotFound

HERE: Final = Path(__file__).resolve().parent
TITLES: Final = {"jobs": "Jobs", "job": "Job", "tasks": "Tasks", "task": "Task",
                 "dlq": "Dead letters", "queues": "Queues and workers"}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ConsoleParts:
    reader: ConsoleReader
    dead_letters: DeadLetters
    operations: Operations
    actions: Actions
    gate: Gate
    refresh_ms: int = 2000


def embed_json(data: Any) -> str:
    """JSON safe inside a <script type="application/json"> element: no `</script>`."""
    return _embeddable(_body(data).decode())


def _embeddable(text: str) -> str:
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def static_version(directory: Path = HERE / "static") -> str:
    """A hash of the front end's files: their URLs change when any of them does."""
    digest = hashlib.blake2b(digest_size=8)
    for path in sorted(p for p in directory.iterdir() if p.is_file()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def create_app(parts: ConsoleParts) -> Starlette:
    # Autoescaping always on, whatever the template's name.
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True)
    env.globals["static_version"] = static_version()
    templates = Jinja2Templates(env=env)
    reader = parts.reader

    def tenant_of(request: Request) -> str:
        return validate_tenant(request.query_params.get("tenant") or reader.default_tenant)

    # Each page's data, by page name; the same function serves the shell and the API.
    def jobs_data(request: Request) -> Any:
        q = request.query_params
        return reader.jobs(tenant=tenant_of(request), state=job_state_filter(q.get("state")),
                           cursor=q.get("cursor") or None, limit=page_size(q.get("limit")),
                           filters=parse_filters(q, states=JOB_STATES))  # fmt: skip

    def job_data(request: Request) -> Any:
        return reader.job(tenant_of(request), request.path_params["job_id"])

    def tasks_data(request: Request) -> Any:
        return reader.tasks(tenant_of(request),
                            parse_filters(request.query_params, states=TASK_STATES))  # fmt: skip

    def task_data(request: Request) -> Any:
        return reader.task(tenant_of(request), request.path_params["request_id"])

    def conversation_data(request: Request) -> Any:
        return reader.conversation(tenant_of(request), request.path_params["request_id"])

    def dlq_data(request: Request) -> Any:
        return parts.dead_letters.list()

    def queues_data(request: Request) -> Any:
        return parts.operations.snapshot()

    loaders: dict[str, Callable[[Request], Any]] = {
        "jobs": jobs_data, "job": job_data, "tasks": tasks_data, "task": task_data,
        "dlq": dlq_data, "queues": queues_data, "conversation": conversation_data,
    }  # fmt: skip

    def page(name: str) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:
            try:
                data = loaders[name](request)
                status = 200
            except ANSWERED_ERRORS as error:
                data, status = problem(error)
            body = _body(data)  # serialised once, for the tag and the page
            context = {
                "etag": _tag(body) if status == 200 else "",
                "page": name,
                "title": TITLES[name],
                "data": _embeddable(body.decode()),
                "status": status,
                "detail": data.get("detail") if status != 200 else None,
                "csrf": parts.gate.csrf(request.state.session),
                # A form's idempotency key: a retried or doubled POST from this page
                # resubmits once (agentq.console.actions).
                "nonce": secrets.token_urlsafe(18),
                "actions": parts.gate.allow_actions,
                "refresh_ms": parts.refresh_ms,
                "api": "/api" + request.url.path,
                "query": request.url.query,
            }
            return templates.TemplateResponse(request, "page.html", context, status_code=status)

        return endpoint

    def api(name: str) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:
            try:
                return etagged(request, loaders[name](request))
            except ANSWERED_ERRORS as error:
                return JSONResponse(*problem(error))

        return endpoint

    def raw_object(request: Request) -> Response:
        try:
            body, truncated = reader.raw_object(
                tenant_of(request), request.path_params["request_id"],
                request.query_params.get("name", ""),
            )  # fmt: skip
        except ANSWERED_ERRORS as error:
            data, status = problem(error)
            return Response(data["detail"], status, media_type="text/plain")
        # Shown as text whatever it holds: never rendered as HTML, sandboxed besides.
        headers = {"Content-Security-Policy": "sandbox; default-src 'none'"}
        if truncated:
            headers["X-Agentq-Truncated"] = "true"
        return Response(body, media_type="text/plain; charset=utf-8", headers=headers)

    async def action(request: Request) -> Response:
        if not parts.gate.allow_actions:
            return JSONResponse(
                {"error": "forbidden", "detail": "actions are off: start with --allow-actions"},
                403,
            )
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "bad request", "detail": "body is not JSON"}, 400)
        if not isinstance(body, dict):
            return JSONResponse({"error": "bad request", "detail": "body is not an object"}, 400)
        try:
            result = await run_in_threadpool(_act, parts.actions, request, body, tenant_of)
        except ANSWERED_ERRORS as error:
            return JSONResponse(*problem(error))
        return JSONResponse(result)

    def home(request: Request) -> Response:
        return RedirectResponse("/jobs", status_code=303)

    routes = [
        Route("/", home),
        Route("/jobs", page("jobs")),
        Route("/jobs/{job_id}", page("job")),
        Route("/tasks", page("tasks")),
        Route("/tasks/{request_id}", page("task")),
        Route("/dlq", page("dlq")),
        Route("/queues", page("queues")),
        Route("/api/jobs", api("jobs")),
        Route("/api/jobs/{job_id}", api("job")),
        Route("/api/tasks", api("tasks")),
        Route("/api/tasks/{request_id}", api("task")),
        Route("/api/tasks/{request_id}/object", raw_object),
        Route("/api/tasks/{request_id}/conversation", api("conversation")),
        Route("/api/dlq", api("dlq")),
        Route("/api/queues", api("queues")),
        Route("/api/actions/{name}", action, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(routes=routes)
    app.add_middleware(GateMiddleware, gate=parts.gate)
    return app


_THROTTLED: Final = {"error": "aws", "detail": "AWS left some tasks unread (throttled); try again"}
# What a page, its JSON or an action answers with a status rather than a crash.
ANSWERED_ERRORS: Final = (AgentqError, ClientError, BotoCoreError)


def problem(error: BaseException) -> tuple[dict[str, Any], int]:
    """The body and status for one of ANSWERED_ERRORS (anything else is a bug: raised)."""
    if isinstance(error, NotFound):
        return {"error": "not found", "detail": str(error)}, 404
    if isinstance(error, InvalidInput):
        return {"error": "bad request", "detail": str(error)}, 400
    if isinstance(error, TasksUnreadable):
        return dict(_THROTTLED), 502
    if isinstance(error, AgentqError):
        return {"error": "failed", "detail": str(error)}, 409
    if isinstance(error, ClientError):
        # What AWS said after botocore's retries (throttled, unavailable, denied): its
        # code only, so nothing of the request leaks into the page; the next poll retries.
        code = str(error.response.get("Error", {}).get("Code") or "error")
        return {"error": "aws", "detail": f"AWS answered {code}; try again"}, 502
    if isinstance(error, BotoCoreError):
        return {"error": "aws", "detail": _unreachable(error)}, 502
    raise error


def _unreachable(error: BotoCoreError) -> str:
    # No answer at all: the endpoint is down (a stopped local stack), unreachable, or
    # there are no credentials. Name the endpoint and what to run, never a traceback.
    kwargs = getattr(error, "kwargs", {}) or {}
    endpoint = kwargs.get("endpoint_url")
    if isinstance(error, NoCredentialsError):
        return ("no AWS credentials: set them (aws configure, AWS_PROFILE) or start the "
                "local stack with `agentq local up` and `source .agentq/local.env`")  # fmt: skip
    if endpoint:
        return (f"AWS at {endpoint} did not answer ({type(error).__name__}): is the stack "
                "up? Start it with `agentq local up` and run `agentq --local console`; for "
                "a deployed stage, source the file `agentq env --stage NAME --output FILE` "
                "writes")  # fmt: skip
    return f"AWS did not answer ({type(error).__name__}); try again"


def _body(data: Any) -> bytes:
    return json.dumps(data, default=str, separators=(",", ":")).encode()


def _tag(body: bytes) -> str:
    return '"' + hashlib.blake2b(body, digest_size=16).hexdigest() + '"'


def etagged(request: Request, data: Any) -> Response:
    body = _body(data)
    etag = _tag(body)
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers={"ETag": etag})
    return Response(body, media_type="application/json", headers={"ETag": etag})


def _act(
    actions: Actions, request: Request, body: dict[str, Any], tenant_of: Callable[[Request], str]
) -> dict[str, Any]:
    name = request.path_params["name"]
    tenant = validate_tenant(body.get("tenant") or tenant_of(request))
    if name == "redrive":
        return actions.redrive(body.get("keys"))  # type: ignore[arg-type]
    if name == "discard":
        return actions.discard(body.get("keys"))  # type: ignore[arg-type]
    if name == "cancel":
        return actions.cancel(tenant, request_id=body.get("requestId"), job_id=body.get("jobId"))
    if name == "retry":
        return actions.retry(tenant, body.get("jobId"), body.get("key"), body.get("nonce"))
    if name == "resubmit":
        return actions.resubmit(tenant, body.get("requestId"), body.get("nonce"))
    if name == "continue":
        return actions.continue_task(tenant, body.get("requestId"), body.get("prompt"),
                                     body.get("nonce"))  # fmt: skip
    raise NotFound("action", name)
