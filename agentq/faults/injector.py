"""Decides which calls fail and installs the decisions on boto3 clients.

Faults go through botocore's event hooks, so every retry is botocore's own:
`before-send` runs once per HTTP attempt (a synthetic error, a connection error, or the
real request sent and its answer replaced), and the batch hooks take failed entries
out of the request and put them back into the answer as failures.

Decisions are replayable: each is drawn from a generator seeded by (seed, service,
operation, n-th call of that operation in this process), so thread interleaving
between operations does not change what any one operation sees.
"""

from __future__ import annotations

import random
import re
import threading
from collections import Counter
from typing import Any

from botocore.awsrequest import AWSPreparedRequest, AWSResponse, HTTPHeaders

from agentq.faults import kinds, partial
from agentq.faults.config import FaultRule, FaultSettings, FaultSpec, Kind
from agentq.faults.log import FaultLog

# Wildcard rules leave provisioning and inspection alone: a harness's CreateTable
# retried after it was applied would only test the harness.
_CONTROL_PLANE = re.compile(
    r"^(Create|Describe|List|Tag|Untag|Delete(Table|Queue|Bucket)|SetQueueAttributes|"
    r"Put(Rule|Targets|Bucket)|Update(Table|TimeToLive|ContinuousBackups)|GetQueueUrl)"
)
_PARTIAL_KEY = "agentq_faults_partial"
_INSTALLED = "_agentq_fault_injector"


def op_matches(pattern: str, service: str, op: str) -> bool:
    if pattern == f"{service}:{op}":
        return True
    if _CONTROL_PLANE.match(op):
        return False
    return pattern in ("*", f"{service}:*")


class FaultInjector:
    """One process's fault decisions, counts and log; shared by all its clients."""

    def __init__(self, spec: FaultSpec, *, seed: int = 0, log_path: str | None = None) -> None:
        self.spec = spec
        self.seed = seed
        self.log = FaultLog(log_path)
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._fired: Counter[int] = Counter()
        self._counts: Counter[str] = Counter()

    @classmethod
    def from_settings(cls, settings: FaultSettings) -> FaultInjector:
        return cls(settings.spec, seed=settings.seed, log_path=settings.log_path)

    def decide(
        self, hook: str, service: str, op: str, body: str
    ) -> tuple[FaultRule, random.Random] | None:
        """The rule that fires on this call (first match wins), with its generator."""
        with self._lock:
            key = f"{hook}|{service}|{op}"
            n = self._calls[key]
            self._calls[key] += 1
            rng = random.Random(f"{self.seed}|{key}|{n}")
            for index, rule in enumerate(self.spec.rules):
                if (rule.kind is Kind.PARTIAL_BATCH) != (hook == "batch"):
                    continue
                if not op_matches(rule.op, service, op) or not kinds.applies(
                    rule.kind, service, op
                ):
                    continue
                if rule.match is not None and rule.match not in body:
                    continue
                if rng.random() >= rule.rate:
                    continue
                if rule.limit is not None and self._fired[index] >= rule.limit:
                    continue
                self._fired[index] += 1
                self._counts[f"{service}:{op}:{rule.kind.value}"] += 1
                self.log.write(service, op, rule.kind.value)
                return rule, rng
        return None

    def counts(self) -> dict[str, int]:
        """Injected faults per `service:op:kind` in this process."""
        with self._lock:
            return dict(sorted(self._counts.items()))

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())


def install(client: Any, injector: FaultInjector) -> Any:
    """Hooks `injector` into one boto3 client (idempotent per client)."""
    if getattr(client, _INSTALLED, None) is not None:
        return client
    setattr(client, _INSTALLED, injector)
    service = client.meta.service_model.service_name
    protocol = client.meta.service_model.protocol
    endpoint = client._endpoint

    def send(request: AWSPreparedRequest) -> AWSResponse:
        response: AWSResponse = endpoint.http_session.send(request)
        return response

    def before_send(request: AWSPreparedRequest, event_name: str, **_: Any) -> Any:
        op = event_name.rsplit(".", 1)[-1]
        chosen = injector.decide("send", service, op, _text(request.body))
        if chosen is None:
            return None
        rule, rng = chosen
        attempt = kinds.Attempt(service, op, protocol, request, rule, rng, send)
        return kinds.PRE_SEND[rule.kind](attempt)

    def before_params(
        params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any
    ) -> None:
        if (service, model.name) not in kinds.BATCH_OPS:
            return
        entries = list(params.get("Entries") or [])
        chosen = injector.decide("batch", service, model.name, repr(params))
        if chosen is None or not entries:
            return
        failed = partial.choose_failed(len(entries), chosen[1])
        context[_PARTIAL_KEY] = (entries, failed)
        if len(failed) < len(entries):
            # When every entry fails, the request stays valid and before_call answers it.
            params["Entries"] = [e for i, e in enumerate(entries) if i not in set(failed)]

    def before_call(model: Any, context: dict[str, Any], **_: Any) -> Any:
        found = context.get(_PARTIAL_KEY)
        if found is None or len(found[1]) < len(found[0]):
            return None
        # Every entry fails: nothing is sent, as when AWS rejects each one.
        entries, failed = context.pop(_PARTIAL_KEY)
        ok = AWSResponse("", 200, HTTPHeaders(), None)
        return ok, partial.answer(service, entries, failed, None)

    def after_call(parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        found = context.pop(_PARTIAL_KEY, None)
        if found is None or "Error" in parsed:
            return
        merged = partial.answer(service, found[0], found[1], parsed)
        parsed.clear()
        parsed.update(merged)

    events = client.meta.events
    events.register_first("before-send", before_send)
    events.register("before-parameter-build", before_params)
    events.register("before-call", before_call)
    events.register("after-call", after_call)
    return client


def _text(body: Any) -> str:
    if isinstance(body, bytes):
        return body.decode("utf-8", "replace")
    if isinstance(body, str):
        return body
    return ""


_process_lock = threading.Lock()
_process: dict[tuple[str, ...], FaultInjector] = {}


def process_injector(settings: FaultSettings, key: tuple[str, ...]) -> FaultInjector:
    """One injector per process and environment, so limits and counts span all clients."""
    with _process_lock:
        if key not in _process:
            _process[key] = FaultInjector.from_settings(settings)
        return _process[key]


def injected_counts() -> dict[str, int]:
    """Faults injected by this process's environment-configured injectors."""
    total: Counter[str] = Counter()
    with _process_lock:
        for injector in _process.values():
            total.update(injector.counts())
    return dict(sorted(total.items()))
