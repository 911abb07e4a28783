"""The local Lambda host: runs the real Lambda handlers against the local stack.

moto delivers EventBridge events to SQS targets but runs no Lambda code and fires no
schedule. The host stands in for the Lambda service:

- one thread per rule-target queue (`LocalResources.target_queues`), routed by the
  rule's `target` in `agentq.resources.RULES` (the definitions `infra/` deploys). Each
  message body is the EventBridge envelope; the handler gets the envelope, one event
  per invocation, as for an EventBridge rule target;
- one thread on the DLQ calling the dlq-processor with the Lambda SQS event shape
  (lower-camel records, `eventSourceARN`), honouring `batchItemFailures` as an event
  source mapping with `ReportBatchItemFailures` does (`batch_failures`);
- a timer calling the health check every HEALTH_CHECK_INTERVAL seconds (0 = off);
- a timer calling the reconciler every RECONCILE_INTERVAL seconds (0 = off).

A handler that raises leaves its message for redelivery, as Lambda does. Handlers run
one at a time: in one process they share Powertools' module-level state, which one
Lambda container never shares between invocations.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import logging
import os
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from agentq.config import Settings
from agentq.errors import ConfigError
from agentq.local.aws import LOCAL_REGION, LocalResources
from agentq.resources import RULES

logger = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any], Any], Any]

# Rule target → handler import path (the CDK stacks reference the same paths).
TARGET_HANDLERS: Final = {
    "save-event": "lambdas.save_event.handler",
    "dispatcher": "lambdas.dispatcher.handler",
}
DLQ_HANDLER: Final = "lambdas.dlq_processor.handler"
HEALTH_HANDLER: Final = "lambdas.health_check.handler"
RECONCILER_HANDLER: Final = "lambdas.reconciler.handler"
_RETRY_VISIBILITY_S: Final = 5


@dataclass
class LocalContext:
    """The context object the Lambda service passes to a handler."""

    function_name: str
    memory_limit_in_mb: int = 256
    timeout_ms: int = 30_000
    aws_request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    invoked_function_arn: str = ""
    log_group_name: str = ""
    log_stream_name: str = ""

    def __post_init__(self) -> None:
        if not self.invoked_function_arn:
            self.invoked_function_arn = (
                f"arn:aws:lambda:{LOCAL_REGION}:000000000000:function:{self.function_name}"
            )

    def get_remaining_time_in_millis(self) -> int:
        return self.timeout_ms


def local_context(function_name: str) -> LocalContext:
    return LocalContext(function_name=function_name)


def load_handler(path: str) -> Handler | None:
    """Import `module.attr` lazily; None (logged) when the module is not there yet."""
    module_name, _, attribute = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            logger.warning("lambda host: %s not available (%s); its messages wait", path, exc)
            return None
        raise
    handler: Handler = getattr(module, attribute)
    return handler


def sqs_lambda_record(message: Mapping[str, Any], *, queue_arn: str) -> dict[str, Any]:
    """A ReceiveMessage result as the Lambda service hands it to a function."""
    attributes: dict[str, Any] = {}
    for name, value in (message.get("MessageAttributes") or {}).items():
        attributes[name] = {
            "stringValue": value.get("StringValue"),
            "binaryValue": _b64(value.get("BinaryValue")),
            "stringListValues": [],
            "binaryListValues": [],
            "dataType": value.get("DataType", "String"),
        }
    body = str(message.get("Body") or "")
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": body,
        "attributes": dict(message.get("Attributes") or {}),
        "messageAttributes": attributes,
        "md5OfBody": message.get("MD5OfBody") or hashlib.md5(body.encode()).hexdigest(),
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": LOCAL_REGION,
    }


def _b64(value: Any) -> str | None:
    import base64

    return base64.b64encode(value).decode() if isinstance(value, bytes | bytearray) else None


def scheduled_event(rule_name: str) -> dict[str, Any]:
    from datetime import UTC, datetime

    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "000000000000",
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": LOCAL_REGION,
        "resources": [f"arn:aws:events:{LOCAL_REGION}:000000000000:rule/{rule_name}"],
        "detail": {},
    }


@dataclass
class _Poller:
    name: str
    queue_url: str
    queue_arn: str
    handler: Handler
    batch: bool  # SQS event source (batch) vs EventBridge target (one envelope per call)
    batch_size: int


class LambdaHost:
    """`LambdaHost(resources, settings).start()` … `.stop()`; also a context manager."""

    def __init__(
        self,
        resources: LocalResources,
        settings: Settings,
        *,
        sqs: Any = None,
        poll_wait_s: int = 1,
        health_interval_s: float | None = None,
        reconcile_interval_s: float | None = None,
        serve_dlq: bool = True,
        only: str | None = None,
    ) -> None:
        self.resources = resources
        self.settings = settings
        self._sqs = sqs
        self._wait_s = poll_wait_s
        self._health_interval_s = (
            settings.health_check_interval_s if health_interval_s is None else health_interval_s
        )
        self._reconcile_interval_s = (
            settings.reconcile_interval_s if reconcile_interval_s is None else reconcile_interval_s
        )
        self._serve_dlq = serve_dlq
        self._only = only  # one function ("save-event", "dlq-processor", ...) or all
        self._stop = threading.Event()
        self._invoke_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._stats_lock = threading.Lock()
        self.invocations: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> LambdaHost:
        self._check_environment()
        os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
        if self._sqs is None:
            from agentq.aws import AwsClients

            self._sqs = AwsClients(self.settings.region).sqs
        for poller in self._pollers():
            self._spawn(f"lambda-host-{poller.name}", functools.partial(self._poll, poller))
        if self._health_interval_s > 0 and self._only in (None, "health-check"):
            self._spawn(
                "lambda-host-health",
                functools.partial(self._timer, self._health_interval_s, self.run_health_check),
            )
        if self._reconcile_interval_s > 0 and self._only in (None, "reconciler"):
            self._spawn(
                "lambda-host-reconciler",
                functools.partial(self._timer, self._reconcile_interval_s, self.run_reconciler),
            )
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop polling; returns once every thread ended (a poll ends within its wait)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=timeout_s)
        alive = [t.name for t in self._threads if t.is_alive()]
        self._threads.clear()
        if alive:
            raise TimeoutError(f"lambda host threads still running: {alive}")

    def __enter__(self) -> LambdaHost:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run_health_check(self) -> Any:
        """One health-check invocation now (what the timer does)."""
        handler = load_handler(HEALTH_HANDLER)
        assert handler is not None
        return self._invoke("health-check", handler, scheduled_event("health-check"))

    def run_reconciler(self) -> Any:
        """One reconciler invocation now (what its timer does)."""
        handler = load_handler(RECONCILER_HANDLER)
        assert handler is not None
        return self._invoke("reconciler", handler, scheduled_event("reconciler"))

    # -- wiring ------------------------------------------------------------------------
    def _check_environment(self) -> None:
        # The handlers read their configuration from the environment, as on Lambda.
        env = Settings.from_env()
        if env.table_name != self.resources.table_name:
            raise ConfigError(
                "DYNAMODB_EVENTS_TABLE_NAME",
                f"is {env.table_name!r}, but the host serves {self.resources.table_name!r}: "
                "apply LocalResources.env() to the environment first",
            )

    def _pollers(self) -> list[_Poller]:
        pollers = []
        rules = {rule.name: rule for rule in RULES}
        for rule_name, url in self.resources.target_queues.items():
            rule = rules.get(rule_name)
            path = TARGET_HANDLERS.get(rule.target) if rule else None
            if rule and self._only not in (None, rule.target):
                continue
            handler = load_handler(path) if path else None
            if handler is None:
                continue
            pollers.append(_Poller(rule_name, url, _arn(self.resources, url), handler, False, 10))
        if self._serve_dlq and self._only in (None, "dlq-processor"):
            handler = load_handler(DLQ_HANDLER)
            if handler is not None:
                pollers.append(
                    _Poller("dlq-processor", self.resources.dlq_url, self.resources.dlq_arn,
                            handler, True, min(self.settings.dlq_batch_size, 10))
                )  # fmt: skip
        return pollers

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # -- the Lambda service's part --------------------------------------------------------
    def _poll(self, poller: _Poller) -> None:
        while not self._stop.is_set():
            try:
                messages = self._sqs.receive_message(
                    QueueUrl=poller.queue_url,
                    MaxNumberOfMessages=poller.batch_size,
                    WaitTimeSeconds=self._wait_s,
                    AttributeNames=["All"],
                    MessageAttributeNames=["All"],
                ).get("Messages", [])
            except Exception:
                logger.exception("lambda host: receive from %s failed", poller.name)
                self._stop.wait(1)
                continue
            if not messages:
                continue
            if poller.batch:
                self._deliver_batch(poller, messages)
            else:
                for message in messages:
                    self._deliver_event(poller, message)

    def _deliver_event(self, poller: _Poller, message: Mapping[str, Any]) -> None:
        try:
            envelope = json.loads(message["Body"])
        except ValueError:
            logger.error("lambda host: %s got a non-JSON event; dropped", poller.name)
            self._delete(poller, [message])
            return
        try:
            self._invoke(poller.name, poller.handler, envelope)
        except Exception:
            self._retry_later(poller, [message])
            return
        self._delete(poller, [message])

    def _deliver_batch(self, poller: _Poller, messages: Sequence[Mapping[str, Any]]) -> None:
        event = {"Records": [sqs_lambda_record(m, queue_arn=poller.queue_arn) for m in messages]}
        try:
            response = self._invoke(poller.name, poller.handler, event)
        except Exception:
            self._retry_later(poller, messages)
            return
        failed = batch_failures(response, [str(m["MessageId"]) for m in messages])
        if failed is None:
            logger.error("lambda host: %s returned an invalid batch response; batch retried",
                         poller.name)  # fmt: skip
            self._retry_later(poller, messages)
            return
        self._delete(poller, [m for m in messages if m["MessageId"] not in failed])
        self._retry_later(poller, [m for m in messages if m["MessageId"] in failed])

    def _invoke(self, name: str, handler: Handler, event: dict[str, Any]) -> Any:
        with self._stats_lock:
            self.invocations[name] += 1
        try:
            with self._invoke_lock:
                return handler(event, local_context(name))
        except Exception:
            with self._stats_lock:
                self.errors[name] += 1
            logger.exception("lambda host: %s raised; the message stays for redelivery", name)
            raise

    def _delete(self, poller: _Poller, messages: Sequence[Mapping[str, Any]]) -> None:
        if not messages:
            return
        self._sqs.delete_message_batch(
            QueueUrl=poller.queue_url,
            Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                     for i, m in enumerate(messages)],
        )  # fmt: skip

    def _retry_later(self, poller: _Poller, messages: Sequence[Mapping[str, Any]]) -> None:
        for message in messages:
            try:
                self._sqs.change_message_visibility(
                    QueueUrl=poller.queue_url,
                    ReceiptHandle=message["ReceiptHandle"],
                    VisibilityTimeout=_RETRY_VISIBILITY_S,
                )
            except Exception:
                logger.exception("lambda host: could not shorten visibility on %s", poller.name)

    def _timer(self, interval_s: float, run: Callable[[], Any]) -> None:
        while not self._stop.wait(interval_s):
            # A failure is logged by _invoke; the next tick tries again.
            with contextlib.suppress(Exception):
                run()


def batch_failures(response: Any, message_ids: Sequence[str]) -> set[str] | None:
    """The message ids a partial batch response fails, None when it fails the whole batch.

    As Lambda judges it: a null or empty response or `batchItemFailures` is complete
    success; a response that is not an object, an identifier that is null, empty, under
    another key or not a message of the batch fails every record.
    """
    if response is None:
        return set()
    if not isinstance(response, Mapping):
        return None
    items = response.get("batchItemFailures")
    if items is None:
        return set()
    if not isinstance(items, list):
        return None
    failed: set[str] = set()
    for item in items:
        identifier = item.get("itemIdentifier") if isinstance(item, Mapping) else None
        if not isinstance(identifier, str) or identifier not in message_ids:
            return None
        failed.add(identifier)
    return failed


def _arn(resources: LocalResources, url: str) -> str:
    name = url.rstrip("/").rsplit("/", 1)[-1]
    account = resources.queue_arn.split(":")[4]
    return f"arn:aws:sqs:{LOCAL_REGION}:{account}:{name}"
