"""Dispatch latency: message visible → child started, and child exit → message deleted.

Tasks go out in bursts (1 at a time, or 10 at once to a worker with 10 slots) while
the worker idles in its long poll; each burst is drained before the next. A message is
visible from the moment SendMessage returns; its child's spawn time comes from /proc
(bench.tasks, 10 ms resolution); its deletion is seen by polling the queue's counters
(one drop per deleted message, matched in order of the children's ends).

The floor beside each figure is the raw round trip of the AWS calls on that path on the
same server: receive + lock (UpdateItem) + PutEvents before the child; S3 PutObject +
UpdateItem + PutEvents + DeleteMessageBatch after it.
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from agentq.local.aws import MotoServer
from bench.stack import (
    Stage,
    envelope,
    new_stage,
    percentile,
    read_side_log,
    stop_all,
    timed_calls,
    wait_started,
    worker_env,
    workers,
)


def _watch_deletes(stage: Stage, expected: int, timeout_s: float = 60.0) -> list[float]:
    """Poll the queue's counters; one timestamp per message that left the queue."""
    seen: list[float] = []
    deadline = time.monotonic() + timeout_s
    left = expected
    while left > 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{left} of {expected} messages not deleted")
        visible, in_flight = stage.queue_counts()
        if visible + in_flight < left:
            seen.extend([time.time()] * (left - visible - in_flight))
            left = visible + in_flight
    return seen


def _burst(stage: Stage, size: int, side_log: Path) -> tuple[list[float], list[float]]:
    """(visible → spawned, end → deleted) seconds for one burst."""
    batch = [envelope("bench-work", {"seconds": 0.2, "side_log": str(side_log)},
                      request_id=f"l-{uuid.uuid4().hex[:16]}") for _ in range(size)]  # fmt: skip
    # From the send's start: a loaded host may return from the send after the worker has
    # already received the message and spawned its child.
    sent = time.time()
    stage.send(batch)
    deleted = _watch_deletes(stage, size)
    ids = {e.request_id for e in batch}
    records = [r for r in read_side_log(side_log) if r["requestId"] in ids]
    starts = [r for r in records if r["event"] == "start"]
    ends = sorted(r["t"] for r in records if r["event"] == "end")
    dispatch = [max(0.0, r["spawned"] - sent) for r in starts]
    settle = [max(0.0, d - e) for d, e in zip(sorted(deleted), ends, strict=False)]
    return dispatch, settle


def _floors(stage: Stage, repeat: int) -> dict[str, float]:
    """Raw round trips of the calls on each path (median seconds)."""
    sqs, ddb = stage.sqs, stage.clients["dynamodb"]
    events, s3 = stage.clients["events"], stage.clients["s3"]
    url = stage.queue_url
    table = stage.resources.table_name

    def receive() -> None:
        sqs.send_message(QueueUrl=url, MessageBody="x")
        message = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=1)
        for m in message.get("Messages", []):
            handles.append(m["ReceiptHandle"])

    handles: list[str] = []
    send_only = timed_calls(lambda: sqs.send_message(QueueUrl=url, MessageBody="x"), repeat)
    # Drain what send_only left so `receive` measures one message each time.
    while sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get(
        "Messages"
    ):
        pass
    stage.set_visibility_timeout(0)
    receive_rtt = max(0.0, timed_calls(receive, repeat) - send_only)
    update = timed_calls(
        lambda: ddb.update_item(
            TableName=table, Key={"PK": {"S": "BENCH#floor"}, "SK": {"S": "STATE"}},
            UpdateExpression="SET n = if_not_exists(n, :z) + :one",
            ConditionExpression="attribute_not_exists(leaseToken)",
            ExpressionAttributeValues={":z": {"N": "0"}, ":one": {"N": "1"}},
        ),
        repeat,
    )  # fmt: skip
    entry = {"Source": "agentq.bench", "DetailType": "Bench Floor",
             "Detail": json.dumps({"x": 1}), "EventBusName": stage.resources.bus_name}  # fmt: skip
    put_events = timed_calls(lambda: events.put_events(Entries=[entry]), repeat)
    put_object = timed_calls(
        lambda: s3.put_object(Bucket=stage.resources.bucket, Key="bench/floor", Body=b"{}"), repeat
    )
    delete = timed_calls(
        lambda: sqs.delete_message_batch(
            QueueUrl=url, Entries=[{"Id": "0", "ReceiptHandle": handles[-1]}]
        ),
        repeat,
    )
    return {
        "receive_s": receive_rtt,
        "update_item_s": update,
        "put_events_s": put_events,
        "put_object_s": put_object,
        "delete_batch_s": delete,
        "dispatch_floor_s": receive_rtt + update + put_events,
        "settle_floor_s": put_object + update + put_events + delete,
    }


def _summary(values: list[float]) -> dict[str, float]:
    return {f"p{q}_ms": round(percentile(values, q) * 1000, 1) for q in (50, 95, 99)}


def run(
    server: MotoServer,
    *,
    quick: bool = False,
    rounds: int | None = None,
    concurrencies: tuple[int, ...] = (1, 10),
) -> dict[str, Any]:
    rounds = rounds or (8 if quick else 40)
    work_dir = Path(tempfile.mkdtemp(prefix="agentq-bench-lat-"))
    results: dict[str, Any] = {}
    for concurrency in concurrencies:
        stage = new_stage(server, prefix="l")
        side_log = work_dir / f"side-{concurrency}.jsonl"
        # Cold children, so a child's spawn time is when its task reached it.
        env = worker_env(
            stage, MAX_CONCURRENT_CLAUDE=str(concurrency), WAIT_TIME_SECONDS="2", WARM_CHILDREN="0"
        )
        dispatch: list[float] = []
        settle: list[float] = []
        with workers(1, env, log_dir=work_dir, name=f"lat{concurrency}-") as fleet:
            wait_started(fleet)
            bursts = rounds if concurrency == 1 else max(2, rounds // 4)
            for _ in range(bursts):
                d, s = _burst(stage, concurrency, side_log)
                dispatch.extend(d)
                settle.extend(s)
            stop_all(fleet)
        results[f"concurrency_{concurrency}"] = {
            "samples": len(dispatch),
            "visible_to_child_started": _summary(dispatch),
            "child_exit_to_deleted": _summary(settle),
        }
    floor_stage = new_stage(server, prefix="f")
    floors = _floors(floor_stage, repeat=10 if quick else 30)
    results["floor_ms"] = {k.removesuffix("_s"): round(v * 1000, 1) for k, v in floors.items()}
    return results
