"""The compiled check of a chunk's JSON lines (``zephon/io/formats/_lines.c``) answers as its
numpy twin does: how many lines, each one object by its first and last byte, or -1; on
generated chunks of braces, newlines, carriage returns and text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon.io.formats import lines
from zephon.testing.data import kjv_records


def test_the_compiled_check_is_built():
    built = lines._objects_per_line is not None
    assert built, "zephon.io.formats._lines was not built: pip install -e . needs a C compiler"


# the rest compares the compiled part with its twin: without it, the test above says why
needs_compiled = pytest.mark.skipif(
    lines._objects_per_line is None, reason="zephon.io.formats._lines not built: see the test above"
)

PARTS = [b"{", b"}", b"\n", b"\r", b"x", b" ", b"{}", b'{"text": "a"}', b"}\r\n{", b"}\n{", b"\r\n"]


@needs_compiled
@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(PARTS), max_size=40).map(b"".join))
def test_compiled_and_numpy_count_the_same_lines(data):
    assert lines._objects_per_line(data) == lines.objects_per_line(data)


@needs_compiled
@pytest.mark.parametrize(
    ("data", "want"),
    [
        (b"", -1),
        (b"\n", -1),
        (b"{}", 1),
        (b"{}\n", 1),
        (b"{}\r\n{}", 2),
        (b"{}\r", 1),
        (b"{}\r\r\n", -1),  # one carriage return allowed, not two
        (b"{\r\n", -1),  # a brace alone is not an object
        (b"{}\n\n{}\n", -1),  # a blank line
        (b'{"a":\n1}\n', -1),  # one object over two lines
        (b" {}\n", -1),
    ],
)
def test_by_hand(data, want):
    assert lines._objects_per_line(data) == want == lines.objects_per_line(data)


@needs_compiled
def test_it_reads_any_bytes_like_and_refuses_text():
    assert lines._objects_per_line(bytearray(b"{}\n{}\n")) == 2
    assert lines._objects_per_line(memoryview(b"{}\n{}")) == 2
    with pytest.raises(TypeError):
        lines._objects_per_line("{}\n")


@needs_compiled
def test_real_lines_give_the_same_records_either_way(monkeypatch):
    import msgspec

    data = b"".join(msgspec.json.encode(r) + b"\n" for r in kjv_records()[:5000])
    compiled = lines._whole_chunk(data)
    monkeypatch.setattr(lines, "_objects_per_line", None)
    assert compiled is not None and lines._whole_chunk(data) == compiled
    assert len(compiled) == 5000
