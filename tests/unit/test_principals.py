"""The principal ARN parser (property-based) and the `tenants` command group's merging."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentq.cli import build_parser
from agentq.cli.tenants_map import register
from agentq.errors import InvalidInput
from agentq.principals import mappable_principal, parse_principal

NAME_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_+=,.@-"
names = st.text(NAME_CHARS, min_size=1, max_size=64)
sessions = st.text(NAME_CHARS, min_size=2, max_size=64)
accounts = st.from_regex(r"\A[0-9]{12}\Z")
partitions = st.sampled_from(["aws", "aws-cn", "aws-us-gov"])
segments = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="/"),
                   min_size=1, max_size=12)  # fmt: skip
paths = st.lists(segments, max_size=4).map(lambda parts: "/" + "".join(p + "/" for p in parts))


@given(partitions, accounts, paths, names, sessions)
def test_a_session_of_a_role_maps_like_the_role_whatever_its_path(
    partition: str, account: str, path: str, name: str, session: str
) -> None:
    role = parse_principal(f"arn:{partition}:iam::{account}:role{path}{name}")
    assumed = parse_principal(f"arn:{partition}:sts::{account}:assumed-role/{name}/{session}")
    assert role.key == assumed.key == f"arn:{partition}:iam::{account}:role/{name}"
    assert (role.kind, role.name, role.account, assumed.assumed) == ("role", name, account, True)
    assert mappable_principal(f"arn:{partition}:iam::{account}:role{path}{name}") == role


@given(partitions, accounts, paths, names)
def test_a_user_is_keyed_by_its_name_without_the_path(
    partition: str, account: str, path: str, name: str
) -> None:
    user = parse_principal(f"arn:{partition}:iam::{account}:user{path}{name}")
    assert user.key == f"arn:{partition}:iam::{account}:user/{name}"
    assert user.key != parse_principal(f"arn:{partition}:iam::{account}:role/{name}").key


@given(st.one_of(st.text(max_size=300), st.binary(max_size=40), st.integers(), st.none()))
def test_any_value_is_a_principal_or_refused_never_a_crash(value: Any) -> None:
    try:
        principal = parse_principal(value)
    except InvalidInput as exc:
        assert exc.field == "principal"
        assert len(str(exc)) < 200  # a long value is described, not quoted
    else:
        assert principal.key.startswith("arn:aws")


VALID = "arn:aws:sts::123456789012:assumed-role/runner/session-1"


@given(st.integers(0, len(VALID) - 1), st.text(max_size=3))
def test_a_damaged_arn_is_refused_or_still_names_a_principal(at: int, text: str) -> None:
    damaged = VALID[:at] + text + VALID[at + 1 :]
    try:
        principal = parse_principal(damaged)
    except InvalidInput:
        return
    # Still well-formed: it parses to what the damaged text says, a valid IAM name.
    assert principal.kind == "role" and len(principal.account) == 12
    assert set(principal.name) <= set(NAME_CHARS)


@pytest.mark.parametrize(
    "arn",
    [
        "arn:aws:iam::123456789012:root",
        "arn:aws:sts::123456789012:federated-user/bob",
        "arn:aws:iam::12345678901:role/short-account",
        "arn:aws:iam::123456789012:role/",
        "arn:aws:iam::123456789012:role/" + "x" * 65,
        "arn:aws:iam::123456789012:group/admins",
        "arn:aws:s3:::bucket",
        "arn:aws:iam:eu-west-1:123456789012:role/regional",
        "arn:aws:sts::123456789012:assumed-role/runner/x",  # a session name is 2+ chars
        "arn:aws:sts::123456789012:assumed-role/runner",
        "arn:aws:iam::123456789012:role/with space",
        "arn:aws:iam::123456789012:role/ünïcode",
        "arn:aws:iam::123456789012:role/path//" + "/" * 600 + "name",
        " arn:aws:iam::123456789012:role/padded",
        "",
    ],
)
def test_what_is_refused(arn: str) -> None:
    with pytest.raises(InvalidInput):
        parse_principal(arn)


def test_a_session_is_not_mappable() -> None:
    with pytest.raises(InvalidInput, match="map its role instead"):
        mappable_principal(VALID)


def _tenants_group(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    group = commands.choices["tenants"]
    assert isinstance(group, argparse.ArgumentParser)
    return group


def test_the_commands_join_a_tenants_group_made_elsewhere() -> None:
    """Another module (sorted first) may own `agentq tenants ...`; these commands join it."""
    parser = argparse.ArgumentParser(prog="agentq")
    top = parser.add_subparsers(dest="command", required=True)
    theirs = top.add_parser("tenants").add_subparsers(dest="their_command", required=True)
    theirs.add_parser("show").add_argument("tenant")
    register(top)
    assert parser.parse_args(["tenants", "show", "acme"]).tenant == "acme"
    mapped = parser.parse_args(["tenants", "map", "arn:aws:iam::123456789012:user/a", "acme"])
    assert (mapped.principal, mapped.tenant) == ("arn:aws:iam::123456789012:user/a", "acme")


def test_the_commands_make_the_group_when_none_exists() -> None:
    group = _tenants_group(build_parser())
    actions = next(a for a in group._actions if isinstance(a, argparse._SubParsersAction))
    assert {"map", "unmap", "list"} <= set(actions.choices)
