"""Uploads are scrubbed as a stream: the same bytes as scrubbing the whole file, in a
chunk's worth of memory.

Secrets are planted at random offsets in random content and the content is cut into
small chunks (1 to 17 bytes), so occurrences cross chunk boundaries, overlap each other
and overlap themselves (secrets drawn from a two-letter alphabet); the streamed result
must equal `redact_known_bytes` of the whole, which is what uploads used to send.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentq import security
from worker.settle.scrub import scrub_chunks, scrub_file

CHECKS = settings(max_examples=400, deadline=None, database=None)
# A small alphabet makes secrets that overlap each other and themselves ("abab", "aaa").
TIGHT = st.binary(min_size=1, max_size=9).map(lambda b: bytes(97 + x % 2 for x in b))
LOOSE = st.binary(min_size=1, max_size=12)
SECRETS = st.lists(st.one_of(TIGHT, LOOSE), min_size=1, max_size=4)
CHUNK = st.integers(min_value=1, max_value=17)


@pytest.fixture(autouse=True)
def forget() -> Iterator[None]:
    yield
    security.remember_environment({})


def _replaced_in_turn(data: bytes, secrets: list[bytes]) -> bytes:
    for secret in secrets:
        data = data.replace(secret, security.REDACTED.encode())
    return data


def _chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@st.composite
def planted(draw: st.DrawFn, secrets: list[bytes]) -> bytes:
    """Filler with the secrets (and pieces of them) planted at random offsets."""
    parts: list[bytes] = []
    for _ in range(draw(st.integers(min_value=0, max_value=8))):
        secret = draw(st.sampled_from(secrets))
        piece = draw(
            st.one_of(
                st.just(secret),
                st.just(secret[: len(secret) // 2]),
                st.binary(max_size=6),
                TIGHT,
            )
        )
        parts.append(piece)
    return b"".join(parts)


@CHECKS
@given(data=st.data(), secrets=SECRETS, size=CHUNK)
def test_streaming_replaces_what_the_whole_file_replace_does(
    data: st.DataObject, secrets: list[bytes], size: int
) -> None:
    content = data.draw(planted(secrets))
    streamed = b"".join(scrub_chunks(_chunks(content, size), secrets))
    assert streamed == _replaced_in_turn(content, secrets)


@CHECKS
@given(
    values=st.lists(
        st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=8, max_size=20),
        min_size=1,
        max_size=3,
    ),
    data=st.data(),
    size=CHUNK,
)
def test_a_scrubbed_file_is_the_whole_file_scrub(
    values: list[str], data: st.DataObject, size: int
) -> None:
    security.remember_environment({f"SECRET_{n}": v for n, v in enumerate(values)})
    known = security.known_secret_bytes()
    content = data.draw(planted(known))
    target = io.BytesIO()
    scrub_file(io.BytesIO(content), target, chunk_bytes=size)
    assert target.getvalue() == security.redact_known_bytes(content)
    for value in values:
        assert value.encode() not in target.getvalue()


class _Recording(io.BytesIO):
    def __init__(self, data: bytes = b"") -> None:
        super().__init__(data)
        self.sizes: list[int] = []

    def read(self, size: int | None = -1, /) -> bytes:
        piece = super().read(size)
        self.sizes.append(len(piece))
        return piece

    def write(self, data: object, /) -> int:
        assert isinstance(data, bytes)
        self.sizes.append(len(data))
        return super().write(data)


def test_a_large_file_is_scrubbed_a_chunk_at_a_time() -> None:
    secret = "planted-" + "s" * 24
    security.remember_environment({"SOME_TOKEN": secret})
    chunk = 4096
    # The secret straddles every chunk boundary, and 200 chunks of filler lie between.
    unit = b"x" * (chunk - 10) + secret.encode()
    content = unit * 200
    source, target = _Recording(content), _Recording()
    scrub_file(source, target, chunk_bytes=chunk)
    assert target.getvalue() == security.redact_known_bytes(content)
    assert secret.encode() not in target.getvalue()
    assert target.getvalue().count(security.REDACTED.encode()) == 200
    # Memory follows the chunk, not the file: no read or write is much over a chunk.
    overlap = sum(len(s) - 1 for s in security.known_secret_bytes())
    assert max(source.sizes) <= chunk
    assert max(target.sizes) <= chunk + overlap


def test_no_remembered_secret_copies_the_file_as_it_is() -> None:
    security.remember_environment({})
    content = bytes(range(256)) * 50
    target = io.BytesIO()
    scrub_file(io.BytesIO(content), target, chunk_bytes=7)
    assert target.getvalue() == content
