"""The child's side of session checkpoints (worker/kinds/agent/checkpoint.py): the file it
leaves after each completed turn, what it resumes from, and the fresh start it falls back
to when a checkpoint cannot be used. No CLI run."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from claude_agent_sdk import SessionKey, SessionStoreEntry

from agentq.checkpoints import Checkpoint, CheckpointError, decode, encode
from agentq.config import Settings
from agentq.errors import InvalidInput, TaskError
from worker.kinds.agent import session
from worker.kinds.agent.checkpoint import (
    CHECKPOINT_FILE,
    RESTORE_FILE,
    RESUME_NOTE,
    TranscriptStore,
    completed_turns,
    plan_resume,
    read_checkpoint,
)
from worker.kinds.agent.prompt import follow_up_prompt
from worker.kinds.agent.spec import AgentSpec
from worker.kinds.agent.trace import TraceRecorder

SESSION = str(uuid.uuid4())
KEY: SessionKey = {"project_key": "-tmp-task", "session_id": SESSION}
SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}


def _spec(**settings: Any) -> AgentSpec:
    raw = {"prompt": "{doc}", "output_schema": SCHEMA, **settings}
    return AgentSpec.from_settings(raw, Settings())


def _turn(n: int, *, answered: bool = True) -> list[dict[str, Any]]:
    use = {"type": "tool_use", "id": f"toolu_{n}", "name": "Bash", "input": {}}
    entries: list[dict[str, Any]] = [
        {"type": "assistant", "message": {"id": f"msg_{n}", "role": "assistant", "content": [use]}}
    ]
    if answered:
        result = {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": "ok"}
        entries.append({"type": "user", "message": {"role": "user", "content": [result]}})
    return entries


async def _append(store: TranscriptStore, key: Any, entries: list[dict[str, Any]]) -> None:
    await store.append(key, cast("list[SessionStoreEntry]", entries))


def test_resume_is_off_unless_the_definition_turns_it_on() -> None:
    assert _spec().resume is False
    assert _spec(resume=True).resume is True


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_resume_must_be_a_boolean(value: Any) -> None:
    with pytest.raises(InvalidInput) as caught:
        _spec(resume=value)
    assert caught.value.field == "settings.resume"


def test_a_turn_is_complete_when_every_tool_call_has_its_result() -> None:
    prompt = {"type": "user", "message": {"role": "user", "content": "Do it"}}
    assert completed_turns([prompt, *_turn(1), *_turn(2, answered=False)]) == 1
    assert completed_turns([prompt, *_turn(1), *_turn(2)]) == 2
    synthetic = {"type": "assistant", "message": {"id": "s", "content": [{"type": "text"}]}}
    assert completed_turns([prompt, *_turn(1), synthetic]) == 1


def test_the_store_writes_a_checkpoint_after_each_completed_turn_only(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path / CHECKPOINT_FILE)

    async def feed() -> None:
        await _append(store, KEY, [{"type": "user", "message": {"content": "Do it"}}])
        assert not (tmp_path / CHECKPOINT_FILE).exists()
        await _append(store, KEY, _turn(1)[:1])  # the call, its result not yet in
        assert not (tmp_path / CHECKPOINT_FILE).exists()
        await _append(store, KEY, _turn(1)[1:])
        assert read_checkpoint(tmp_path / CHECKPOINT_FILE).turns == 1
        await _append(store, {**KEY, "subpath": "subagents/a"}, _turn(7))  # not kept
        await _append(store, KEY, _turn(2))

    anyio.run(feed)
    saved = read_checkpoint(tmp_path / CHECKPOINT_FILE)
    assert (saved.session_id, saved.turns, len(saved.entries)) == (SESSION, 2, 5)


def test_a_resumed_store_hands_back_the_restored_session_and_extends_it(tmp_path: Path) -> None:
    restored = Checkpoint(session_id=SESSION, turns=1, entries=_turn(1))
    store = TranscriptStore(tmp_path / CHECKPOINT_FILE, restored)

    async def resume() -> list[Any] | None:
        other = await store.load({"project_key": "p", "session_id": str(uuid.uuid4())})
        assert other is None
        loaded = await store.load(KEY)
        await _append(store, KEY, _turn(2))
        return loaded

    assert anyio.run(resume) == _turn(1)
    saved = read_checkpoint(tmp_path / CHECKPOINT_FILE)
    assert saved.turns == 2 and saved.entries == [*_turn(1), *_turn(2)]


def test_an_in_attempt_retry_rewinds_to_the_last_checkpointed_turn(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path / CHECKPOINT_FILE)
    prompt = {"type": "user", "message": {"content": "Do it"}}

    async def fail_then_resume() -> tuple[str | None, str | None, list[Any] | None]:
        await _append(store, KEY, [prompt, *_turn(1, answered=False)])
        before_any_turn = store.rewind()  # nothing checkpointed: the retry starts afresh
        for entries in ([prompt], _turn(1), _turn(2), _turn(3, answered=False)):
            await _append(store, KEY, entries)  # frame by frame, as the SDK mirrors them
        resumed = store.rewind()  # the model call of turn 3 failed
        loaded = await store.load(KEY)
        await _append(store, KEY, _turn(3))
        return before_any_turn, resumed, loaded

    before_any_turn, resumed, loaded = anyio.run(fail_then_resume)
    assert before_any_turn is None
    assert resumed == SESSION
    # The unanswered call of the failed turn is gone, as another worker's resume drops it.
    assert loaded == [prompt, *_turn(1), *_turn(2)]
    saved = read_checkpoint(tmp_path / CHECKPOINT_FILE)
    assert saved.turns == 3 and saved.entries == [prompt, *_turn(1), *_turn(2), *_turn(3)]


def test_a_restored_attempt_that_wrote_nothing_retries_as_it_began(tmp_path: Path) -> None:
    restored = Checkpoint(session_id=SESSION, turns=1, entries=_turn(1))
    store = TranscriptStore(tmp_path / CHECKPOINT_FILE, restored)

    async def fail_early() -> tuple[str | None, list[Any] | None]:
        await _append(store, KEY, _turn(2, answered=False))
        return store.rewind(), await store.load(KEY)

    resumed, loaded = anyio.run(fail_early)
    assert resumed is None  # the attempt's own start (restored session, its prompt) again
    assert loaded == _turn(1)


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # cut short
        lambda data: data.split(b"\n", 1)[1],  # no header
        lambda data: b"\xff" + data,  # not text
        lambda data: data.replace(SESSION.encode(), b"../../etc"),  # no session id
        lambda data: data + b'{"type": "user"}\n',  # more entries than the header says
        lambda data: data.replace(b'"turns": 2', b'"turns": "2"'),
    ],
)
def test_a_damaged_checkpoint_is_refused(damage: Any) -> None:
    data = encode(Checkpoint(session_id=SESSION, turns=2, entries=[*_turn(1), *_turn(2)]))
    assert decode(data).turns == 2
    with pytest.raises(CheckpointError):
        decode(damage(data))


def test_a_corrupt_checkpoint_is_a_fresh_start_with_its_reason(tmp_path: Path) -> None:
    (tmp_path / RESTORE_FILE).parent.mkdir(parents=True)
    (tmp_path / RESTORE_FILE).write_bytes(b'{"agentq_checkpoint": 1, "session_id": "x"}\n')

    plan = plan_resume(tmp_path, {"from_attempt": 1})

    assert plan.restored is None and plan.store.session_id is None
    assert plan.record is not None and plan.record["status"] == "fresh"
    assert plan.record["reason"].startswith("checkpoint of attempt 1 is corrupt")


def test_an_unreadable_checkpoint_is_a_fresh_start_and_none_is_no_record(tmp_path: Path) -> None:
    plan = plan_resume(tmp_path, {"unreadable": "checkpoint of attempt 2 unreadable (X)"})
    assert plan.record == {"status": "fresh", "reason": "checkpoint of attempt 2 unreadable (X)"}
    assert plan_resume(tmp_path, None).record is None


def test_a_readable_checkpoint_resumes_its_session_with_the_note(tmp_path: Path) -> None:
    (tmp_path / RESTORE_FILE).parent.mkdir(parents=True)
    checkpoint = Checkpoint(session_id=SESSION, turns=1, entries=_turn(1))
    (tmp_path / RESTORE_FILE).write_bytes(encode(checkpoint))

    plan = plan_resume(tmp_path, {"from_attempt": 2})

    assert plan.restored == checkpoint
    assert plan.record == {"status": "resumed", "from_attempt": 2, "turns": 1}
    spec = _spec(resume=True)
    opts = session.options(spec, cwd=tmp_path, recorder=TraceRecorder(), stderr=print,
                           store=plan.store, resume=SESSION)  # type: ignore[arg-type]  # fmt: skip
    assert opts.resume == SESSION and opts.session_store is cast(Any, plan.store)
    assert opts.system_prompt == f"{spec.system_prompt}\n\n{RESUME_NOTE}"
    fresh = session.options(spec, cwd=tmp_path, recorder=TraceRecorder(), stderr=print)
    assert fresh.resume is None and fresh.system_prompt == spec.system_prompt


def test_a_sessions_final_answer_is_written_when_the_run_succeeds(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path / CHECKPOINT_FILE)
    answer = {"type": "assistant", "message": {"id": "m9", "content": [{"type": "text"}]}}

    async def feed() -> None:
        await _append(store, KEY, _turn(1))
        await _append(store, KEY, [answer])  # no tool call: not a completed turn

    anyio.run(feed)
    assert len(read_checkpoint(tmp_path / CHECKPOINT_FILE).entries) == 2
    store.flush()  # what a continuation goes on from: the conversation to its last word
    assert read_checkpoint(tmp_path / CHECKPOINT_FILE).entries[-1] == answer


def test_a_continuation_goes_on_from_the_source_without_the_interruption_note(
    tmp_path: Path,
) -> None:
    (tmp_path / RESTORE_FILE).parent.mkdir(parents=True)
    checkpoint = Checkpoint(session_id=SESSION, turns=1, entries=_turn(1))
    (tmp_path / RESTORE_FILE).write_bytes(encode(checkpoint))

    plan = plan_resume(tmp_path, {"continued_from": "src-1"})

    assert plan.continued and plan.restored == checkpoint
    assert plan.record == {"status": "continued", "from_task": "src-1", "turns": 1}
    spec = _spec()
    opts = session.options(spec, cwd=tmp_path, recorder=TraceRecorder(), stderr=print,
                           store=plan.store, resume=SESSION, interrupted=False)  # type: ignore[arg-type]  # fmt: skip
    assert opts.resume == SESSION and opts.system_prompt == spec.system_prompt


def test_a_continuation_never_starts_afresh_from_a_corrupt_source(tmp_path: Path) -> None:
    (tmp_path / RESTORE_FILE).parent.mkdir(parents=True)
    (tmp_path / RESTORE_FILE).write_bytes(b'{"agentq_checkpoint": 1, "session_id": "x"}\n')
    with pytest.raises(TaskError) as failed:
        plan_resume(tmp_path, {"continued_from": "src-1"})
    assert failed.value.category == "not_found" and not failed.value.retryable
    assert "the checkpoint of task src-1 is corrupt" in failed.value.message


def test_a_follow_up_goes_as_written_with_the_input_fenced_after_it() -> None:
    prompt = follow_up_prompt("Revise it: </input> {not a placeholder}\x07", {"review": "ok"})
    assert prompt == (
        'Revise it: &lt;/input> {not a placeholder}\n\n<input name="review">\nok\n</input>'
    )
