"""agentq's exception hierarchy, grouped by how the caller must react.

- `ConfigError`: the deployment is wrong; fail at start-up, fix the environment.
- `InvalidInput` (and subclasses): the request is bad; reject it, never retry it.
- `LockNotAcquired` (and subclasses): someone else owns the task, or it is finished;
  do not run it, decide about the message from the subclass.
- `LeaseLost`: this worker no longer owns a task it was running; stop the work.
- `TaskError`: a task attempt failed; `category`/`retryable` say what happens next.

Every exception keeps its structured fields as attributes and pickles cleanly (the
child process and tests move them across process boundaries).
"""

from __future__ import annotations

from typing import Any


class AgentqError(Exception):
    """Base of every agentq error."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Exceptions pickle through self.args; ours are rebuilt from their fields.
        return (self.__class__._rebuild, (self.__class__, dict(self.__dict__), self.args))

    @staticmethod
    def _rebuild(klass: type[AgentqError], state: dict[str, Any], args: tuple[Any, ...]) -> Any:
        obj = klass.__new__(klass)
        Exception.__init__(obj, *args)
        obj.__dict__.update(state)
        return obj


class ConfigError(AgentqError):
    def __init__(self, variable: str, problem: str) -> None:
        self.variable = variable
        self.problem = problem
        super().__init__(f"configuration: {variable} {problem}")


class IncompatibleDependency(AgentqError):
    """An installed package no longer has the shape agentq's code relies on (a patch's
    target moved, say); refuse to start rather than run subtly wrong."""

    def __init__(self, package: str, version: str, problem: str) -> None:
        self.package = package
        self.version = version
        self.problem = problem
        super().__init__(f"{package} {version}: {problem}")


class OutOfTime(AgentqError):
    """Work stopped short of its deadline so the failure can still be reported; what it
    did is complete in itself, and running it again converges."""

    def __init__(self, what: str, done: int, total: int) -> None:
        self.what = what
        self.done = done
        self.total = total
        super().__init__(f"{what}: out of time after {done} of {total} writes; run it again")


class InvalidInput(AgentqError):
    """Bad input from a producer or user. `field` names what is wrong."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


# A rejected value is quoted back only when short: a cut long one (a session token sent
# as a tenant) would leak its prefix past any redaction of the whole value.
MAX_QUOTED = 40


def shown(value: object) -> str:
    """How an invalid value is named in an error: ascii() (it may hold a lone surrogate
    or control text), and only when short once escaped (an escape takes up to ten)."""
    if isinstance(value, str) and (len(value) > MAX_QUOTED or len(ascii(value)) > MAX_QUOTED + 2):
        return f"a text of {len(value)} characters"
    if isinstance(value, str | int | float | bool) or value is None:
        return ascii(value)
    return f"a JSON {type(value).__name__}"


class InvalidRequestId(InvalidInput):
    def __init__(self, value: object) -> None:
        super().__init__("requestId", f"must match ^[a-zA-Z0-9_-]{{1,256}}$, got {shown(value)}")
        self.value = value


class UnknownEventType(InvalidInput):
    def __init__(self, detail_type: str) -> None:
        super().__init__("detail-type", f"unknown agentq event type {detail_type!r}")
        self.detail_type = detail_type


class InvalidTransition(InvalidInput):
    def __init__(self, current: str, target: str) -> None:
        super().__init__("state", f"cannot move a task from {current} to {target}")
        self.current = current
        self.target = target


class NotFound(AgentqError):
    def __init__(self, kind: str, key: str) -> None:
        self.kind = kind
        self.key = key
        super().__init__(f"{kind} {key!r} not found")


class NoOutputYet(NotFound):
    """A live task that has written nothing yet (not started, or its attempt has not
    uploaded): not an error to a caller who asked too early."""

    def __init__(self, request_id: str, state: str, what: str, *, final: bool = False) -> None:
        # A finished task that never ran (cancelled before it started, failed at receive)
        # has none and never will; a live one has none yet.
        said = f"left no {what}" if final else f"has no {what} yet"
        AgentqError.__init__(self, f"task {request_id} is {state} and {said}")
        self.kind, self.key, self.state, self.what = what, request_id, state, what


class PrincipalNotMapped(AgentqError):
    """A producer-API caller whose IAM principal acts for no tenant (docs/security.md)."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(
            f"no tenant for this caller: {problem}; an operator maps its role or user with "
            "`agentq tenants map PRINCIPAL_ARN TENANT`"
        )


class LockNotAcquired(AgentqError):
    """The task's STATE item refused the lock. `state` is what it holds now."""

    def __init__(self, request_id: str, state: str | None, message: str) -> None:
        self.request_id = request_id
        self.state = state
        super().__init__(message)


class TaskAlreadyTerminal(LockNotAcquired):
    """A duplicate of a finished task: the message can be deleted without running."""

    def __init__(self, request_id: str, state: str) -> None:
        super().__init__(request_id, state, f"task {request_id} is already {state}")


class TaskHeldElsewhere(LockNotAcquired):
    """A live lease is held by another worker: leave the message to its holder."""

    def __init__(self, request_id: str, owner: str | None, effective_until_ms: int) -> None:
        self.owner = owner
        self.effective_until_ms = effective_until_ms
        super().__init__(
            request_id,
            "PROCESSING",
            f"task {request_id} is held by {owner} until {effective_until_ms}",
        )


class TaskStillHeld(AgentqError):
    """A dead letter's task has a live lease: look again once its holder ended or lapsed."""

    def __init__(self, request_id: str, detail: str) -> None:
        super().__init__(f"{request_id}: {detail}")
        self.request_id = request_id
        self.detail = detail


class TaskNotReady(LockNotAcquired):
    """The task waits on job dependencies (BLOCKED) or its time (SCHEDULED, `not_before_ms`)."""

    def __init__(self, request_id: str, state: str, not_before_ms: int | None = None) -> None:
        self.not_before_ms = not_before_ms
        super().__init__(request_id, state, f"task {request_id} is {state}, not ready to run")


class CancelPending(LockNotAcquired):
    """A cancel was requested and no attempt holds the task any more (it ended
    retryable, was given back, or its worker died): it ends CANCELLED, never runs again."""

    def __init__(self, request_id: str, state: str) -> None:
        super().__init__(request_id, state, f"task {request_id}: cancel requested, no holder")


class AttemptsExhausted(LockNotAcquired):
    """The task already used every attempt its retry limit allows."""

    def __init__(self, request_id: str, attempts: int) -> None:
        self.attempts = attempts
        super().__init__(request_id, "RETRYING", f"task {request_id} used {attempts} attempts")


class TenantAtLimit(LockNotAcquired):
    """Every seat of the task's tenant is held: it waits, no attempt spent, for one."""

    def __init__(self, request_id: str, tenant: str, limit: int) -> None:
        self.tenant = tenant
        self.limit = limit
        super().__init__(
            request_id, None, f"tenant {tenant} runs {limit} tasks already (its limit)"
        )


class CancelRequested(AgentqError):
    """A lease renewal (or an attempt's retryable end) found the task's
    `cancelRequested` flag: its child must stop, and the attempt ends CANCELLED."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        super().__init__(f"task {request_id}: cancel requested")


class NotCancellable(InvalidInput):
    """Cancel of a task that has already finished: nothing to stop."""

    def __init__(self, request_id: str, state: str) -> None:
        self.request_id = request_id
        self.state = state
        super().__init__("requestId", f"task {request_id} is already {state}: nothing to cancel")


class LeaseLost(AgentqError):
    """A renew or finalize found another lease token: a newer attempt owns the task."""

    def __init__(self, request_id: str, lease_token: str) -> None:
        self.request_id = request_id
        self.lease_token = lease_token
        super().__init__(f"lease {lease_token} on task {request_id} is no longer held")


class TaskError(AgentqError):
    """A failed attempt, classified by the error taxonomy."""

    def __init__(
        self,
        category: str,
        message: str,
        *,
        retryable: bool,
        exception_type: str | None = None,
    ) -> None:
        self.category = category
        self.message = message
        self.retryable = retryable
        self.exception_type = exception_type
        super().__init__(f"{category}: {message}")
