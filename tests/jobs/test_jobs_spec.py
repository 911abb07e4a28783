"""Job spec parsing and validation, without AWS: expansion, references, cycles."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentq.definitions import TaskDefinition
from agentq.errors import InvalidInput, NotFound
from agentq.jobs import check_definitions, load_spec_file, parse_spec
from agentq.jobs.refs import KEEP, Ref, select, substitute, unescape
from agentq.store.codec import to_item

pytestmark = pytest.mark.timeout(30)


def test_jobs_docs_example_expands_fan_out_and_infers_dependencies(tmp_path: Path) -> None:
    docs = (Path(__file__).parents[2] / "docs" / "jobs.md").read_text()
    example = docs.split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "report.yaml").write_text(example)
    spec = parse_spec(load_spec_file(tmp_path / "report.yaml"))
    assert spec.keys == ["summarize_0", "summarize_1", "summarize_2", "report", "publish"]
    first = spec.task("summarize_1")
    assert first.input == {"document": "...", "label": "part 1: Q2"}
    assert first.group == "summarize"
    assert spec.task("report").depends_on == ("summarize_0", "summarize_1", "summarize_2")
    assert spec.task("publish").depends_on == ("report",)
    assert [t.key for t in spec.roots] == ["summarize_0", "summarize_1", "summarize_2"]
    assert parse_spec(spec.to_dict()) == spec  # the stored form round-trips


def test_jobs_references_substitute_whole_values_and_splice_text() -> None:
    results = {"a": {"n": 1, "items": ["x", "y"]}}

    def lookup(ref: Ref, where: str) -> Any:
        return results[ref.name] if ref.kind == "task" else KEEP

    value = {
        "whole": "${tasks.a.result}",
        "field": "${tasks.a.result.items.1}",
        "text": "n=${tasks.a.result.n} all=${tasks.a.result}",
        "kept": "${groups.g.results}",
        "literal": "$${tasks.a.result}",
        "nested": [{"deep": "${tasks.a.result.n}"}],
    }
    out = unescape(substitute(value, "input", lambda r, w: _select(lookup, r, w)))
    assert out == {
        "whole": {"n": 1, "items": ["x", "y"]},
        "field": "y",
        "text": 'n=1 all={"n":1,"items":["x","y"]}',
        "kept": "${groups.g.results}",
        "literal": "${tasks.a.result}",
        "nested": [{"deep": 1}],
    }


def _select(lookup: Any, ref: Ref, where: str) -> Any:
    from agentq.jobs.refs import select

    found = lookup(ref, where)
    return found if found is KEEP else select(found, ref.path, where)


def test_jobs_for_each_elements_are_data_not_references() -> None:
    spec = parse_spec(
        {
            "tasks": {
                "f": {"definition": "d", "for_each": ["${tasks.x.result}"],
                      "input": {"v": "${item}"}},
            }
        }
    )  # fmt: skip
    assert spec.task("f_0").input == {"v": "$${tasks.x.result}"}
    assert spec.task("f_0").depends_on == ()


@pytest.mark.parametrize(
    ("tasks", "words"),
    [
        ({"a": {"definition": "d", "depends_on": ["c"]}, "b": {"definition": "d",
          "depends_on": ["a"]}, "c": {"definition": "d", "input": {"x": "${tasks.b.result}"}}},
         "dependency cycle: a → c → b → a"),
        ({"a": {"definition": "d", "input": {"x": "${tasks.a.result}"}}}, "depend on itself"),
        ({"a": {"definition": "d", "input": {"x": "${tasks.nope.result}"}}},
         "tasks.a.input: ${tasks.nope.result} names no task"),
        ({"a": {"definition": "d", "input": {"x": "${groups.g.results}"}}}, "names no group"),
        ({"a": {"definition": "d", "input": {"x": "${task.b}"}}}, "bad reference ${task.b}"),
        ({"a": {"definition": "d", "input": {"x": "${item}"}}}, "only allowed in a for_each"),
        ({"a": {"definition": "d", "depends_on": ["ghost"]}}, "no task or group named 'ghost'"),
        ({"a b": {"definition": "d"}}, "task keys must match"),
        ({"a": {"definition": "d", "retries": 3}}, "unknown field(s): retries"),
        ({"a": {"input": {}}}, "tasks.a.definition"),
        ({"a": {"definition": "d", "for_each": []}}, "non-empty list"),
        ({"a": {"definition": "d", "for_each": [1]}, "a_0": {"definition": "d"}},
         "duplicate task key"),
        ({"g": {"definition": "d"}, "x": {"definition": "d", "group": "g"}},
         "a group and a task share this name"),
        ({}, "at least one task"),
        ({"a": {"definition": "d", "input": {"": 1}}}, "tasks.a.input: has an empty key"),
        ({"a": {"definition": "d", "not_before": "300000000000000"}},
         "tasks.a.not_before: is after the year 9999"),
        ({"a": {"definition": "d", "input": {"x": "\ud800"}}}, "tasks.a.input.x: holds a lone"),
        ({"a": {"definition": "d", "input": {"x": 1e200}}}, "tasks.a.input.x: number (1e+200)"),
        ({"f": {"definition": "d", "for_each": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[0]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
          "input": {"v": "${item}"}}}, "tasks.f_0.input.v[0]"),
    ],
)  # fmt: skip
def test_jobs_bad_specs_are_rejected_naming_the_problem(tasks: Any, words: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_spec({"tasks": tasks})
    assert words in str(caught.value)


def test_jobs_unknown_definitions_and_policies_are_rejected() -> None:
    spec = parse_spec({"tasks": {"a": {"definition": "known"}, "b": {"definition": "nope"}}})

    def lookup(name: str) -> object:
        if name != "known":
            raise NotFound("task definition", name)
        return name

    with pytest.raises(InvalidInput, match=r"tasks\.b\.definition: unknown task definition"):
        check_definitions(spec.tasks, lookup)
    with pytest.raises(InvalidInput, match="failure_policy"):
        parse_spec({"failure_policy": "yolo", "tasks": {"a": {"definition": "d"}}})


def test_a_job_task_missing_a_prompt_placeholder_is_refused_at_creation_like_submit() -> None:
    summarize = TaskDefinition(name="summarize", kind="agent",
                               settings={"prompt": "Summarize {document} for {audience}"})  # fmt: skip
    tasks = {
        "ok": {"definition": "summarize",
               "input": {"document": "${item.d}", "audience": "ops"},
               "for_each": [{"d": "x"}]},
        "late": {"definition": "summarize", "input": {"document": "${groups.ok.results}"}},
    }  # fmt: skip
    spec = parse_spec({"tasks": tasks})
    with pytest.raises(InvalidInput) as caught:
        check_definitions(spec.tasks, {"summarize": summarize}.__getitem__)
    assert caught.value.field == "tasks.late.input.audience"
    assert "is required by the prompt of 'summarize'" in caught.value.problem
    # A reference resolved later counts: its key is there at creation.
    ok_only = parse_spec({"tasks": {"ok": tasks["ok"]}})
    check_definitions(ok_only.tasks, {"summarize": summarize}.__getitem__)


def test_jobs_added_tasks_may_depend_on_existing_ones_but_not_reuse_keys() -> None:
    base = parse_spec({"tasks": {"a": {"definition": "d"}}})
    extended = parse_spec(
        {"tasks": {"b": {"definition": "d", "input": {"x": "${tasks.a.result}"}}}},
        existing=base,
    )
    assert extended.keys == ["a", "b"] and extended.task("b").depends_on == ("a",)
    with pytest.raises(InvalidInput, match="duplicate task key"):
        parse_spec({"tasks": {"a": {"definition": "d"}}}, existing=base)


def test_jobs_spec_files_report_unreadable_input(tmp_path: Path) -> None:
    broken = tmp_path / "job.json"
    broken.write_text("{not json")
    with pytest.raises(InvalidInput, match=r"not valid \.json"):
        load_spec_file(broken)
    with pytest.raises(InvalidInput, match="cannot read"):
        load_spec_file(tmp_path / "missing.yaml")


_TEXT = st.text(st.characters(codec=None), max_size=6) | st.sampled_from(
    ["", "\ud800", "k" * 70_000]
)
_INPUTS = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False)
    | st.integers(-(10**45), 10**45) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=10,
)  # fmt: skip


def _stored_keys(value: object) -> list[str]:
    if isinstance(value, dict):
        return [k for key, child in value.items() for k in [key, *_stored_keys(child)]]
    if isinstance(value, list):
        return [k for child in value for k in _stored_keys(child)]
    return []


# Derandomized: a CI run once failed inside Hypothesis itself (FlakyStrategyDefinition on
# replaying a deep recursive input), with no example of ours to blame; the same 300
# examples every run keep this test about the spec, not about the generator.
@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(task_input=st.dictionaries(_TEXT, _INPUTS, max_size=4))
def test_jobs_spec_keeps_only_what_the_job_item_can_store(task_input: dict[str, Any]) -> None:
    try:
        spec = parse_spec({"tasks": {"a": {"definition": "d", "input": task_input}}})
    except InvalidInput as refused:
        assert refused.field.startswith("tasks.a.input"), refused
        return
    stored = spec.to_dict()
    # What real DynamoDB refuses and boto3's serializer lets through: empty or 64 KiB
    # map keys, text that is not UTF-8, numbers past 38 digits or 1e125.
    assert all(0 < len(key.encode()) < 65_536 for key in _stored_keys(stored))
    item = to_item({"spec": stored})
    json.dumps(item, ensure_ascii=False).encode()
    for number in _numbers(item):
        assert len(number.lstrip("-").replace(".", "").lstrip("0").split("E")[0]) <= 38, number
        assert abs(Decimal(number)) < Decimal("1e126"), number


def _numbers(value: object) -> list[str]:
    if isinstance(value, dict):
        if set(value) == {"N"}:
            return [value["N"]]
        return [n for child in value.values() for n in _numbers(child)]
    if isinstance(value, list):
        return [n for child in value for n in _numbers(child)]
    return []


@pytest.mark.parametrize("step", ["²", "٣", "1" * 5_000, "-1", " 1"])
def test_jobs_a_path_step_that_is_no_list_index_is_a_missing_field(step: str) -> None:
    # "²".isdigit() is true and int("²") raises ValueError: that crashed the dispatcher.
    with pytest.raises(InvalidInput, match="result has no field"):
        select([1, 2, 3], (step,), "tasks.b.input")
    with pytest.raises(InvalidInput, match="result has no field"):
        parse_spec({"tasks": {"f": {"definition": "d", "for_each": [[1, 2]],
                                    "input": {"v": "${item." + step + "}"}}}})  # fmt: skip


@settings(max_examples=300, deadline=None, database=None)
@given(value=_INPUTS, path=st.lists(_TEXT, max_size=4))
def test_jobs_select_returns_a_value_or_names_the_missing_field(
    value: Any, path: list[str]
) -> None:
    try:
        select(value, tuple(path), "where")
    except InvalidInput as missing:
        assert missing.field == "where"


NOTES = TaskDefinition(name="notes", kind="agent",
                       settings={"prompt": "Note {text}", "resume": True})  # fmt: skip
CONTINUED: dict[str, dict[str, Any]] = {
    "draft": {"definition": "notes", "input": {"text": "x"}},
    "revise": {"definition": "notes", "continues": "draft", "prompt": "Shorter, please."},
}


def test_a_job_task_continues_another_and_depends_on_it() -> None:
    spec = parse_spec({"tasks": CONTINUED})
    revise = spec.task("revise")
    assert revise.depends_on == ("draft",)
    assert (revise.continues, revise.prompt) == ("draft", "Shorter, please.")
    # Its prompt is the follow-up: the definition's {text} is not needed.
    check_definitions(spec.tasks, {"notes": NOTES}.__getitem__)
    assert parse_spec(spec.to_dict()).task("revise") == revise  # as the job item keeps it


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"continues": "nobody"}, "tasks.revise.continues", "no task of this job named"),
        ({"continues": None}, "tasks.revise.continues", "go together"),
        ({"prompt": None}, "tasks.revise.prompt", "go together"),
    ],
)
def test_a_job_continuation_must_name_a_task_of_the_job_and_a_prompt(
    change: dict[str, Any], field: str, words: str
) -> None:
    revise = {k: v for k, v in {**CONTINUED["revise"], **change}.items() if v is not None}
    with pytest.raises(InvalidInput) as refused:
        parse_spec({"tasks": {**CONTINUED, "revise": revise}})
    assert refused.value.field == field and words in refused.value.problem


def test_a_job_continuation_of_a_task_without_a_session_is_refused_at_creation() -> None:
    spec = parse_spec({"tasks": CONTINUED})
    off = TaskDefinition(name="notes", kind="agent", settings={"prompt": "Note {text}"})
    with pytest.raises(InvalidInput) as refused:
        check_definitions(spec.tasks, {"notes": off}.__getitem__)
    assert refused.value.field == "tasks.revise.continues"
    assert "has resume off" in refused.value.problem
    python = {"notes": NOTES, "noop": TaskDefinition(name="noop", kind="python")}
    tasks = {**CONTINUED, "revise": {**CONTINUED["revise"], "definition": "noop"}}
    with pytest.raises(InvalidInput) as refused:
        check_definitions(parse_spec({"tasks": tasks}).tasks, python.__getitem__)
    assert refused.value.field == "tasks.revise.definition"


def test_a_job_tasks_own_resume_is_kept_for_each_task_it_expands_to() -> None:
    spec = parse_spec({"tasks": {
        "one": {"definition": "notes", "input": {"text": "x"}, "resume": False},
        "many": {"definition": "notes", "input": {"text": "${item}"}, "for_each": ["a", "b"],
                 "resume": True},
        "plain": {"definition": "notes", "input": {"text": "y"}},
    }})  # fmt: skip
    assert [spec.task(k).resume for k in ("one", "many_0", "many_1", "plain")] == [
        False, True, True, None,
    ]  # fmt: skip
    stored = spec.to_dict()["tasks"]
    assert stored["one"]["resume"] is False and "resume" not in stored["plain"]
    assert parse_spec(spec.to_dict()) == spec  # as the job item keeps it


@pytest.mark.parametrize("value", ["true", 1, 0, "yes", None])
def test_a_job_tasks_resume_must_be_true_or_false(value: Any) -> None:
    task = {"definition": "notes", "input": {"text": "x"}, "resume": value}
    if value is None:  # null: the definition decides
        assert parse_spec({"tasks": {"a": task}}).task("a").resume is None
        return
    with pytest.raises(InvalidInput) as refused:
        parse_spec({"tasks": {"a": task}})
    assert refused.value.field == "tasks.a.resume"


def test_a_job_tasks_resume_for_a_definition_that_is_not_an_agents_is_refused() -> None:
    spec = parse_spec({"tasks": {"a": {"definition": "noop", "resume": True}}})
    found = {"noop": TaskDefinition(name="noop", kind="python")}
    with pytest.raises(InvalidInput) as refused:
        check_definitions(spec.tasks, found.__getitem__)
    assert refused.value.field == "tasks.a.resume"
    assert "'noop' is a python definition: only an agent task" in refused.value.problem


def test_a_job_continuation_follows_its_sources_own_resume() -> None:
    off = TaskDefinition(name="notes", kind="agent", settings={"prompt": "Note {text}"})
    turned_on = {**CONTINUED, "draft": {**CONTINUED["draft"], "resume": True}}
    check_definitions(parse_spec({"tasks": turned_on}).tasks, {"notes": off}.__getitem__)
    turned_off = {**CONTINUED, "draft": {**CONTINUED["draft"], "resume": False}}
    with pytest.raises(InvalidInput) as refused:
        check_definitions(parse_spec({"tasks": turned_off}).tasks, {"notes": NOTES}.__getitem__)
    assert refused.value.field == "tasks.revise.continues"
    assert "keeps no session to continue: it has resume: false" in refused.value.problem
