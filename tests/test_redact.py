"""The one redaction: a job's secret values replaced in its output, wherever the reads of the stream split them."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from runner import contract
from runner.redact import MIN_LENGTH, Redactor, job_secrets

TOKEN = b"tok-5f1e2d3c4b5a"


def stream(redactor: Redactor, chunks: list[bytes]) -> bytes:
    return b"".join(redactor.feed(c) for c in chunks) + redactor.flush()


def test_a_value_is_replaced_by_its_name() -> None:
    out = stream(Redactor({"API_TOKEN": TOKEN}), [b"the token is " + TOKEN + b"\n"])
    assert out == b"the token is [redacted API_TOKEN]\n"


def test_a_value_split_at_every_point_of_two_reads_is_replaced() -> None:
    text = b"before " + TOKEN + b" after " + TOKEN
    for cut in range(len(text) + 1):
        assert stream(Redactor({"T": TOKEN}), [text[:cut], text[cut:]]) == b"before [redacted T] after [redacted T]"


def test_a_value_fed_one_byte_at_a_time_is_replaced_and_nothing_else_is_lost() -> None:
    text = b"tok-5f1e tok-" + TOKEN + b"tok-"  # partial matches that turn out not to be the value
    assert stream(Redactor({"T": TOKEN}), [bytes([b]) for b in text]) == b"tok-5f1e tok-[redacted T]tok-"


def test_what_is_held_back_is_only_what_could_start_a_value() -> None:
    redactor = Redactor({"T": TOKEN})
    assert redactor.feed(b"no secret here, but tok") == b"no secret here, but "
    assert redactor.feed(b"en") == b"token"  # "token" is not "tok-...": passed on at once


def test_multi_line_values_lines_and_a_final_line_break() -> None:
    key = b"-----BEGIN KEY-----\nline-one-abcdef\nline-two-ghijkl\n"
    redactor = Redactor({"KEY": key, "T": TOKEN + b"\n"})
    out = stream(redactor, [b"whole: " + key, b"one: line-two-ghijkl; token: " + TOKEN + b"."])
    assert b"line-one" not in out and b"line-two" not in out and TOKEN not in out
    assert out.count(b"[redacted KEY]") >= 2 and b"token: [redacted T]." in out


def test_short_values_are_not_replaced() -> None:
    assert stream(Redactor({"PIN": b"1" * (MIN_LENGTH - 1)}), [b"epoch 111 of 1111"]) == b"epoch 111 of 1111"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=12), max_size=8),
    st.lists(st.integers(min_value=0, max_value=40), max_size=6),
)
def test_no_split_of_any_stream_lets_a_value_through(parts: list[bytes], cuts: list[int]) -> None:
    text = TOKEN.join(parts) + TOKEN
    points = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    out = stream(Redactor({"T": TOKEN}), chunks)
    assert TOKEN not in out
    assert out == stream(Redactor({"T": TOKEN}), [text])  # the same, however it was read


def test_the_jobs_secrets_are_found_where_the_job_finds_them(tmp_path: Path) -> None:
    (tmp_path / "key").write_bytes(b"file-secret-value")
    environ = {
        contract.SECRETS: json.dumps({"A": "env", "B": "file", "C": "file"}),
        "A": "env-secret-value",
        "B": str(tmp_path / "key"),
        "C": str(tmp_path / "missing"),
    }
    assert job_secrets(environ) == {"A": b"env-secret-value", "B": b"file-secret-value"}
    assert job_secrets({}) == {} and job_secrets({contract.SECRETS: "not json"}) == {}
