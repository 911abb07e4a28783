"""A command imports its own module alone, and parses as the whole parser does.

`agentq.cli.COMMANDS` names the module of each command; these tests hold it to what the
modules register, and show that the command word is found wherever the global options
put it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentq.cli import COMMANDS, build_parser, command_modules, command_of


def _registered(module_name: str) -> set[str]:
    module = importlib.import_module(f"agentq.cli.{module_name}")
    register = getattr(module, "register", None)
    if register is None:
        return set()
    subparsers = argparse.ArgumentParser().add_subparsers()
    register(subparsers)
    return set(subparsers.choices)


def test_every_command_is_mapped_to_the_modules_that_register_it() -> None:
    registered: dict[str, tuple[str, ...]] = {}
    for module in command_modules():  # in the order the whole parser takes them
        for name in _registered(module):
            registered[name] = (*registered.get(name, ()), module)
    assert registered == COMMANDS


_GLOBALS = st.lists(
    st.one_of(
        st.sampled_from(["--local", "--debug"]),
        st.tuples(st.just("--local-env"), st.sampled_from(["submit", "env", "-x", "a b"])),
        st.sampled_from(["--local-env=submit", "--local-env=x"]),
    ),
    max_size=4,
)


@given(_GLOBALS, st.sampled_from(sorted(COMMANDS)), st.lists(st.text(max_size=8), max_size=3))
def test_the_command_is_the_first_word_that_no_option_takes(
    options: list[str | tuple[str, str]], command: str, rest: list[str]
) -> None:
    argv: list[str] = []
    for option in options:
        argv.extend(option if isinstance(option, tuple) else [option])
    assert command_of([*argv, command, *rest]) == command
    assert command_of(argv) is None


@pytest.mark.parametrize(
    "argv",
    [
        ["--local", "submit", "echo", "--input", '{"a": 1}', "--priority", "high", "--json"],
        ["status", "req-1", "--tenant", "acme", "--json"],
        ["job", "create", "spec.json", "--json"],
        ["--debug", "logs", "req-1", "--tenant", "acme"],
        ["dlq", "list", "--json"],
        ["tenants", "limit", "acme", "3"],
        ["tenants", "map", "arn:aws:iam::123456789012:role/r", "acme", "--json"],
    ],
)
def test_a_command_parsed_alone_reads_as_with_every_command(argv: list[str]) -> None:
    alone = vars(build_parser(command_of(argv)).parse_args(argv))
    whole = vars(build_parser().parse_args(argv))
    assert alone.pop("func").__qualname__ == whole.pop("func").__qualname__
    assert alone == whole


def test_a_command_imports_no_other_command_module() -> None:
    probe = (
        "import contextlib, io, json, sys\n"
        "from agentq.cli import main\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['--local', 'status', '--help'])\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('agentq.cli.'))))\n"
    )
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    loaded = {name.removeprefix("agentq.cli.") for name in json.loads(ran.stdout)}
    assert "tasks" in loaded
    assert not loaded & ({m for modules in COMMANDS.values() for m in modules} - {"tasks"})
