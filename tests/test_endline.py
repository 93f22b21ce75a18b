"""The status line a pooled call's launcher, or a cold call's guard, writes after the
command's output (orchestrator/sandbox/containers/pool.py's EndLine), found in any split of the
stream, kept out of the output, and never a reason to hold output back unbounded."""

from __future__ import annotations

from orchestrator.sandbox.containers.pool import EndLine


def read(chunks, nonce="n"):
    end, out = EndLine(nonce), b""
    for chunk in chunks:
        out += end.feed(chunk)
        if end.found:
            break
    if not end.found:
        out += end.flush()
    return out, end


def test_the_line_is_found_whole_or_split_and_kept_out_of_the_output():
    out, end = read([b"hello\n\0wakeloop:n:003:?\nafter"])
    assert (out, end.exit_code, end.oom, end.rest) == (b"hello\n", 3, "?", b"after")
    out, end = read([b"hel", b"lo\n\0wak", b"eloop:n:0", b"37:1", b"\nX"])
    assert (out, end.exit_code, end.oom, end.rest) == (b"hello\n", 37, "1", b"X")


def test_another_nonce_is_output():
    out, end = read([b"a\0wakeloop:m:000:0\nb"])
    assert not end.found and out == b"a\0wakeloop:m:000:0\nb"


def test_a_needle_not_followed_by_a_line_is_output_not_held_back():
    # The guard's needle holds no secret: a command may print it, then a gigabyte.
    end = EndLine("held")
    given = len(end.feed(b"a\0wakeloop:held:"))
    for _ in range(1000):
        given += len(end.feed(b"y" * 4096))
    assert not end.found and given > 4_000_000
    assert len(end.flush()) < 64


def test_a_stream_of_needles_is_output():
    out, end = read([b"\0wakeloop:n:" * 5000 + b"end"])
    assert not end.found and out.endswith(b"end") and len(out) == 5000 * 12 + 3
