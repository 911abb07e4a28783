"""The definitions bundle a deployment ships: what it holds, and how its reader refuses
anything else (every refusal an InvalidInput, nothing unpacked outside its scratch)."""

from __future__ import annotations

import io
import json
import tempfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentq.definitions import load_directory
from agentq.definitions.bundle import MANIFEST, read_bundle, stage_bundle
from agentq.definitions.sync import DefinitionSource, load_sources
from agentq.errors import InvalidInput

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "definitions" / "samples"

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
NAMES = st.one_of(
    st.sampled_from(
        [
            MANIFEST,
            "0/a.yaml",
            "0/b.json",
            "1/a.yml",
            "0/",
            "../x.yaml",
            "/abs.yaml",
            "0/../../x.yaml",
            "0/sub/a.yaml",
            "00/a.yaml",
            "0/a.txt",
        ]
    ),
    # zipfile cuts a name at its first NUL (a name of only NULs cannot be written at all),
    # and cannot write a lone surrogate (no archive can hold one: not UTF-8).
    st.text(
        st.characters(blacklist_characters="\x00", codec="utf-8"),
        min_size=1,
        max_size=12,
    ),
)
CONTENTS = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"name: a\nkind: python\n",
            b"name: B\nkind: agent\n",
            b"- name: c\n  kind: agent\n",
            b"[unclosed",
            b"\xff\xfe",
        ]
    ),
    JSON.map(lambda v: json.dumps(v).encode()),
)
MANIFESTS = st.one_of(
    JSON.map(lambda v: json.dumps(v).encode()),
    st.lists(
        st.fixed_dictionaries(
            {"dir": st.sampled_from(["0", "1", "x", "../0"]), "label": st.text(max_size=10)}
        ),
        max_size=3,
    ).map(lambda d: json.dumps({"format": 1, "directories": d}).encode()),
)


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _staged(tmp_path: Path, *sources: DefinitionSource) -> bytes:
    out = tmp_path / "bundle"
    stage_bundle(list(sources), out)
    return _zip(
        {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    )


def test_a_staged_bundle_reads_back_as_its_directories(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "own.yaml").write_text("name: own-task\nkind: python\nsettings: {}\n")
    (mine / "notes.txt").write_text("not a definition")
    sources = [DefinitionSource(SAMPLES, "definitions/samples"), DefinitionSource(mine, "mine")]

    read = read_bundle(_staged(tmp_path, *sources))

    assert read == load_sources(sources)
    assert set(read) == set(load_directory(SAMPLES)) | {"own-task"}


def test_errors_name_the_file_by_its_label(tmp_path: Path) -> None:
    mine = tmp_path / "somewhere" / "deep"
    mine.mkdir(parents=True)
    (mine / "bad.yaml").write_text("name: ok-name\nkind: agent\nretries: 2\n")
    archive = _staged(tmp_path, DefinitionSource(mine, "my_definitions"))

    with pytest.raises(InvalidInput) as caught:
        read_bundle(archive)
    assert str(caught.value) == "my_definitions/bad.yaml: unknown field(s): retries"


def test_a_name_defined_in_two_directories_is_refused(tmp_path: Path) -> None:
    archive = _staged(
        tmp_path, DefinitionSource(SAMPLES, "definitions/samples"), DefinitionSource(SAMPLES, "b")
    )
    with pytest.raises(InvalidInput, match=r"^b: defines .* again"):
        read_bundle(archive)


@settings(max_examples=150, deadline=None)
@given(manifest=MANIFESTS, members=st.dictionaries(NAMES, CONTENTS, max_size=4))
def test_any_archive_is_read_or_refused_as_invalid_input(
    manifest: bytes, members: dict[str, bytes]
) -> None:
    # A temporary directory of this test's own: other processes of the suite read
    # bundles into the shared one at the same time.
    with tempfile.TemporaryDirectory() as private:
        saved, tempfile.tempdir = tempfile.tempdir, private
        try:
            found = read_bundle(_zip({MANIFEST: manifest, **members}))
        except InvalidInput:
            pass
        else:
            assert all(name == d.name for name, d in found.items())
        finally:
            tempfile.tempdir = saved
        # The scratch directory is gone, whatever the archive held.
        assert list(Path(private).iterdir()) == []


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_are_read_or_refused_as_invalid_input(data: bytes) -> None:
    with pytest.raises(InvalidInput):
        read_bundle(data)


def test_an_oversized_or_crowded_bundle_is_refused() -> None:
    with pytest.raises(InvalidInput, match=r"larger than"):
        read_bundle(b"\0" * (5 * 1024 * 1024 + 1))
    crowded = {f"0/f{i}.yaml": b"" for i in range(2001)}
    with pytest.raises(InvalidInput, match=r"more than 2000 files"):
        read_bundle(_zip({MANIFEST: b"{}", **crowded}))
