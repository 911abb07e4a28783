"""The job and definitions the README and the demo point users at stay valid."""

from __future__ import annotations

from pathlib import Path

from agentq.definitions import DefinitionRegistry
from agentq.demo import demo_spec
from agentq.jobs.spec import check_definitions, load_spec_file, parse_spec

REPO = Path(__file__).resolve().parents[2]


def _registry() -> DefinitionRegistry:
    return DefinitionRegistry.from_sources(
        directories=[REPO / "definitions" / "samples", REPO / "definitions" / "demo"]
    )


def test_readme_example_job_is_valid() -> None:
    spec = parse_spec(load_spec_file(REPO / "examples" / "job.yaml"))
    check_definitions(spec.tasks, _registry().get)
    assert [t.key for t in spec.tasks] == ["summarize_0", "summarize_1", "report"]


def test_demo_job_is_valid_and_expects_every_task() -> None:
    raw, expected = demo_spec(offline=True)
    spec = parse_spec(raw)
    check_definitions(spec.tasks, _registry().get)
    assert sorted(e.key for e in expected) == sorted(t.key for t in spec.tasks)
    assert spec.failure_policy == "continue"
