"""The definitions bundle a deployment ships: definition directories as one zip asset.

Layout (what `stage_bundle` writes and CDK zips)::

    manifest.json          {"format": 1, "directories": [{"dir": "0", "label": "definitions/samples"}]}
    0/summarize.yaml       the directory's definition files, nothing else
    1/...

`read_bundle` is the deployment's side: it unpacks only names of that shape into a
scratch directory and loads each with `load_directory`, exactly as `agentq definitions
sync` loads a directory, so an error names the file as the user knows it (its label).
The archive comes from the deployment's own asset bucket, yet it is read as untrusted:
its size, its member count and every name are checked before anything is written.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from agentq.definitions.registry import DEFINITION_SUFFIXES, TaskDefinition
from agentq.definitions.sync import DefinitionSource, load_sources
from agentq.errors import InvalidInput

MANIFEST: Final = "manifest.json"
FORMAT: Final = 1
MAX_BUNDLE_BYTES: Final = 5 * 1024 * 1024
MAX_MEMBERS: Final = 2000
MAX_LABEL: Final = 256
_MEMBER: Final = re.compile(
    r"^(?P<dir>[0-9]{1,4})/(?P<file>[A-Za-z0-9_-][A-Za-z0-9_.-]{0,199})$", flags=re.ASCII
)
_LABEL: Final = re.compile(r"^[^\x00-\x1f\x7f]+$")


def stage_bundle(sources: Sequence[DefinitionSource], out: Path) -> None:
    """Copy each directory's definition files into `out` and write the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, str]] = []
    for index, source in enumerate(sources):
        _check_label(source.label)
        if not source.directory.is_dir():
            raise InvalidInput(source.label, "no such directory")
        target = out / str(index)
        target.mkdir()
        # The files load_directory reads: visible, top level, a definition suffix.
        for path in sorted(source.directory.glob("*")):
            if path.is_file() and path.suffix in DEFINITION_SUFFIXES:
                if not _MEMBER.match(f"{index}/{path.name}"):
                    raise InvalidInput(
                        f"{source.label}/{path.name}", "use letters, digits, '_', '-', '.' only"
                    )
                shutil.copyfile(path, target / path.name)
        entries.append({"dir": str(index), "label": source.label})
    manifest = {"format": FORMAT, "directories": entries}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def read_bundle(archive: bytes) -> dict[str, TaskDefinition]:
    """The bundle's definitions, all validated, or `InvalidInput` naming the bad file."""
    if len(archive) > MAX_BUNDLE_BYTES:
        raise InvalidInput("definitions bundle", f"larger than {MAX_BUNDLE_BYTES} bytes")
    try:
        bundle = zipfile.ZipFile(io.BytesIO(archive))
        members = bundle.infolist()
    except (zipfile.BadZipFile, ValueError, EOFError) as exc:
        raise InvalidInput("definitions bundle", f"not a zip archive ({exc})") from None
    if len(members) > MAX_MEMBERS:
        raise InvalidInput("definitions bundle", f"more than {MAX_MEMBERS} files")
    with bundle, tempfile.TemporaryDirectory(prefix="agentq-definitions-") as scratch:
        root = Path(scratch)
        sources = _manifest(bundle)
        labels = dict(sources)
        for directory in labels:
            # An archiver may leave out an empty directory; the manifest still names it.
            (root / directory).mkdir()
        total = 0
        for member in members:
            if member.is_dir() or member.filename == MANIFEST:
                continue
            match = _MEMBER.match(member.filename)
            if match is None or match["dir"] not in labels:
                raise InvalidInput("definitions bundle", f"unexpected file {member.filename!r}")
            total += member.file_size
            if total > MAX_BUNDLE_BYTES:
                raise InvalidInput("definitions bundle", "unpacks to too many bytes")
            (root / match["dir"] / match["file"]).write_bytes(_read(bundle, member))
        return load_sources(DefinitionSource(root / d, label) for d, label in sources)


def _manifest(bundle: zipfile.ZipFile) -> list[tuple[str, str]]:
    try:
        info = bundle.getinfo(MANIFEST)
    except KeyError:
        raise InvalidInput("definitions bundle", f"has no {MANIFEST}") from None
    try:
        data: Any = json.loads(_read(bundle, info))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InvalidInput("definitions bundle", f"{MANIFEST} is not JSON") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InvalidInput("definitions bundle", f"{MANIFEST} is not format {FORMAT}")
    entries = data.get("directories")
    if not isinstance(entries, list):
        raise InvalidInput("definitions bundle", f"{MANIFEST} lists no directories")
    sources: list[tuple[str, str]] = []
    for entry in entries:
        directory = entry.get("dir") if isinstance(entry, dict) else None
        label = entry.get("label") if isinstance(entry, dict) else None
        if not isinstance(directory, str) or not _MEMBER.match(f"{directory}/x"):
            raise InvalidInput("definitions bundle", f"{MANIFEST} has a bad directory entry")
        _check_label(label)
        if directory in dict(sources):
            raise InvalidInput("definitions bundle", f"{MANIFEST} lists {directory!r} twice")
        sources.append((directory, str(label)))
    return sources


def _read(bundle: zipfile.ZipFile, member: zipfile.ZipInfo) -> bytes:
    # file_size is what the archive claims; read no more than it, whatever inflates.
    if member.file_size > MAX_BUNDLE_BYTES:
        raise InvalidInput("definitions bundle", f"{member.filename!r} is too large")
    try:
        with bundle.open(member) as handle:
            return handle.read(member.file_size + 1)[: member.file_size]
    except (zipfile.BadZipFile, NotImplementedError, ValueError, EOFError) as exc:
        raise InvalidInput(
            "definitions bundle", f"cannot read {member.filename!r}: {exc}"
        ) from None


def _check_label(label: object) -> None:
    if not isinstance(label, str) or not 0 < len(label) <= MAX_LABEL or not _LABEL.match(label):
        raise InvalidInput("definitions bundle", "a directory label must be 1..256 printable chars")
