"""workload/traces/: each format's reader on its sample and its malformed fixture, detection, one-line errors."""

import math
from datetime import datetime, timezone
from pathlib import Path

import pytest

from optimizer.errors import ConfigError
from optimizer.workload.traces import FORMATS, TraceError, TraceRow, detect, read_trace
from optimizer.workload.traces._fields import Bad, whole
from optimizer.workload.traces.azure import wall_clock

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "examples" / "traces"
BAD = ROOT / "tests" / "fixtures" / "traces"


def reasons(entries) -> dict[int, str]:
    return {b.line: b.reason for b in entries}


def one_line_error(call, *args, **kw) -> str:
    with pytest.raises(TraceError) as info:
        call(*args, **kw)
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, ConfigError) and info.value.exit_code == 2
    return message


# --- the samples -----------------------------------------------------------------------------


def test_sharegpt_sample_one_row_per_conversation_reply_as_text():
    got = read_trace(SAMPLES / "sample.sharegpt.json")
    assert got.format == "sharegpt" and len(got.rows) == 12 and not got.bad and not got.excluded
    first = got.rows[0]
    assert first == TraceRow(
        line=1, output_tokens=0,
        prompt="What is the boiling point of water at the top of a 3000 m mountain?",
        output_text="At about 3000 m, air pressure is roughly 70% of sea level, so water boils at around "
                    "90 degrees Celsius. Cooking times for pasta or eggs get a little longer as a result.")
    assert [r.line for r in got.rows] == list(range(1, 13))
    assert all(r.output_tokens == 0 and r.output_text and r.timestamp_s is None and r.input_tokens is None
               for r in got.rows)
    multi_turn = got.rows[2]  # four turns: only the first human/gpt pair is replayed
    assert multi_turn.prompt.startswith("Explain what a hash map is")
    assert multi_turn.output_text.startswith("A list finds things by position")


def test_burstgpt_sample_seconds_counts_and_failures_excluded():
    got = read_trace(SAMPLES / "sample.burstgpt.csv")
    assert got.format == "burstgpt" and len(got.rows) == 38 and not got.bad
    assert got.rows[0] == TraceRow(line=2, output_tokens=118, timestamp_s=1.25, input_tokens=472)
    assert reasons(got.excluded) == {10: "logged as a failure (Response tokens 0)",
                                     28: "logged as a failure (Response tokens 0)"}
    lines = [r.line for r in got.rows]
    assert lines == [n for n in range(2, 42) if n not in (10, 28)]  # the header is line 1
    times = [r.timestamp_s for r in got.rows]
    assert times == sorted(times) and times[-1] == 57.26  # seconds, not ms
    assert all(1 <= r.input_tokens <= 4096 and 1 <= r.output_tokens <= 512 for r in got.rows)


def test_azure_sample_seven_digit_wall_clock_to_epoch_seconds():
    got = read_trace(SAMPLES / "sample.azure.csv")
    assert got.format == "azure" and len(got.rows) == 39 and not got.bad
    start = datetime(2024, 3, 5, 9, 12, 0, tzinfo=timezone.utc).timestamp()
    first = got.rows[0]
    assert (first.line, first.input_tokens, first.output_tokens) == (2, 1830, 24)
    assert first.timestamp_s == pytest.approx(start + 0.041235, abs=1e-6)
    # 2024-03-05 09:12:01.5050587 on line 3: the 7th digit counts
    assert got.rows[1].timestamp_s - first.timestamp_s == pytest.approx(1.4638237, abs=1e-6)
    assert reasons(got.excluded) == {18: "logged with no output (GeneratedTokens 0)"}
    assert got.rows[-1].timestamp_s - first.timestamp_s == pytest.approx(97.2995066, abs=1e-6)


def test_mooncake_sample_ms_to_seconds_and_one_hash_id_per_512_tokens():
    got = read_trace(SAMPLES / "sample.mooncake.jsonl")
    assert got.format == "mooncake" and len(got.rows) == 30 and not got.bad and not got.excluded
    assert got.rows[0] == TraceRow(line=1, output_tokens=160, timestamp_s=0.0, input_tokens=2439,
                                   hash_ids=(0, 1, 40, 41, 42))
    assert got.rows[2].timestamp_s == 3.943  # 3943 ms
    assert all(len(r.hash_ids) == math.ceil(r.input_tokens / 512) for r in got.rows)
    assert sum(r.hash_ids[:2] == (0, 1) for r in got.rows) >= 5  # a shared system prompt
    assert sum(r.hash_ids[:4] == (2, 3, 4, 5) for r in got.rows) >= 5  # a shared document
    assert max(r.input_tokens for r in got.rows) <= 4096


def test_generic_jsonl_sample_mixes_prompts_and_counts():
    got = read_trace(SAMPLES / "sample.jsonl")
    assert got.format == "jsonl" and len(got.rows) == 20 and not got.bad
    assert got.rows[0] == TraceRow(line=1, output_tokens=64, timestamp_s=0.0,
                                   prompt="How many minutes are in a week?")
    assert got.rows[1] == TraceRow(line=2, output_tokens=117, timestamp_s=0.999, input_tokens=1128)
    assert all((r.prompt is None) != (r.input_tokens is None) for r in got.rows)
    assert {r.prompt is None for r in got.rows} == {True, False}


# --- the malformed fixtures ------------------------------------------------------------------


def test_bad_burstgpt_rows_by_file_line():
    got = read_trace(BAD / "bad.burstgpt.csv")
    assert reasons(got.bad) == {
        3: "Request tokens is not a number: 'abc'",
        4: "expected 6 comma-separated fields, found 5",
        7: "Request tokens must be >= 1, got 0",
        8: "Response tokens must be >= 0, got -4",
        9: "Response tokens must be a whole number, got '12.5'",
        12: "Timestamp must be >= 0, got '-1'",  # lines 10-11 are one quoted record
    }
    assert reasons(got.excluded) == {5: "logged as a failure (Response tokens 0)"}
    assert [(r.line, r.input_tokens) for r in got.rows] == [(2, 120), (10, 64), (13, 48)]  # 48.0 is 48


def test_bad_azure_rows_by_file_line():
    got = read_trace(BAD / "bad.azure.csv")
    assert reasons(got.bad) == {
        4: "TIMESTAMP is neither a date-time nor a number of seconds: 'yesterday'",
        5: "TIMESTAMP '2024-02-30 10:00:00.5' is not a valid date-time (day is out of range for month)",
        7: "ContextTokens is not a number: 'true'",
        8: "expected 3 comma-separated fields, found 2",
    }
    assert reasons(got.excluded) == {6: "logged with no output (GeneratedTokens 0)"}
    assert [r.line for r in got.rows] == [2, 3, 9]
    assert got.rows[2].timestamp_s - got.rows[0].timestamp_s == pytest.approx(5.6265433, abs=1e-6)


def test_bad_mooncake_rows_by_file_line():
    got = read_trace(BAD / "bad.mooncake.jsonl")
    assert reasons(got.bad) == {
        2: "hash_ids has 1 id, but input_length 600 is 2 blocks of 512 tokens (one id per block)",
        4: "missing key 'hash_ids'",
        5: "not valid JSON (Expecting value at column 1)",
        6: "input_length must be a whole number, got 100.5",
        7: "output_length is not a number: True",
        9: "hash_ids has 2 ids, but input_length 1025 is 3 blocks of 512 tokens (one id per block)",
        10: "unknown key 'session_id' (allowed: timestamp, input_length, output_length, hash_ids)",
        11: "not a JSON object (a list)",
    }  # line 3 is blank: skipped, not bad
    assert [(r.line, r.hash_ids) for r in got.rows] == [(1, (0, 1)), (8, (5, 6))]  # 1024 tokens: 2 blocks
    assert got.rows[1].timestamp_s == 0.05


def test_bad_jsonl_rows_by_file_line():
    got = read_trace(BAD / "bad.jsonl")
    one_of = "give exactly one of 'prompt' (text) or 'input_tokens' (a count)"
    assert reasons(got.bad) == {
        3: one_of,
        4: one_of,
        5: "unknown key 'max_tokens' (allowed: timestamp, prompt, input_tokens, output_tokens)",
        6: "missing key 'output_tokens'",
        7: "no timestamp, but line 1 has one (give it on every row or on none)",
        8: "timestamp must be >= 0, got -1",
        9: "prompt must be non-empty text, got '   '",
        10: "input_tokens must be a whole number, got 12.5",
        12: "output_tokens must be >= 1, got 0",
        13: "not valid JSON (Expecting property name enclosed in double quotes at column 59)",
    }
    assert [(r.line, r.input_tokens) for r in got.rows] == [(1, None), (2, 100), (11, 12)]


def test_bad_sharegpt_entries_by_array_position():
    got = read_trace(BAD / "bad.sharegpt.json")
    assert reasons(got.bad) == {  # malformed: blocks a default run
        2: "not a JSON object (a str)",
        3: "no 'conversations' list",
        6: "turns 1 and 2: 'value' must be text",
    }
    assert reasons(got.excluded) == {  # well formed, but nothing to replay: left out with a note
        4: "no 'human' turn is followed by a 'gpt' answer, so no output length",
        5: "empty prompt (the human turn has no text)",
        8: "empty reply (the gpt turn has no text, so no output length)",
    }
    assert [(r.line, r.prompt, r.output_text) for r in got.rows] == [
        (1, "Name a colour.", "Teal."), (7, "Name a prime.", "7")]  # a system turn first is fine


def test_jsonl_without_timestamps_on_the_first_row_refuses_later_timestamps(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"input_tokens": 5, "output_tokens": 2}\n{"timestamp": 1, "input_tokens": 5, "output_tokens": 2}\n')
    got = read_trace(path)
    assert [r.line for r in got.rows] == [1]
    assert reasons(got.bad) == {2: "has a timestamp, but line 1 has none (give it on every row or on none)"}


@pytest.mark.parametrize("value, expected", [(12, 12), (12.0, 12), ("12", 12), (" 12.0 ", 12), ("1e3", 1000)])
def test_whole_numbers_accepted(value, expected):
    assert whole(value, "n", 0) == expected


@pytest.mark.parametrize("value", [12.5, "12.5", True, False, "nan", "inf", float("nan"), "1_000", None, "", "²"])
def test_whole_numbers_refused(value):
    with pytest.raises(Bad):
        whole(value, "n", 0)


@pytest.mark.parametrize("text, offset", [
    ("2023-11-16 18:15:46.6805900", 46.68059), ("2023-11-16 18:15:46.68", 46.68), ("2023-11-16 18:15:46", 46.0),
    ("2023-11-16T18:15:46.5Z", 46.5), ("2023-11-16 19:15:46.5+01:00", 46.5), ("1700158546.25", 46.25),
])
def test_azure_timestamp_forms(text, offset):
    minute = datetime(2023, 11, 16, 18, 15, tzinfo=timezone.utc).timestamp()
    assert wall_clock(text) - minute == pytest.approx(offset, abs=1e-6)


def test_crlf_and_bom_keep_line_numbers(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xef\xbb\xbfTIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                     b"2023-11-16 18:15:46.6805900,10,2\r\n\r\nbad,10,2\r\n")
    assert detect(path) == "azure"
    got = read_trace(path)
    assert [r.line for r in got.rows] == [2] and [b.line for b in got.bad] == [4]


def test_absurd_values_are_bad_rows_with_short_reasons(tmp_path):
    huge = "9" * 5000  # past Python's 4300-digit int limit: a ValueError, not a JSONDecodeError
    path = tmp_path / "t.jsonl"
    path.write_text(f'{{"input_tokens": {huge}, "output_tokens": 2}}\n{{"input_tokens": 5, "output_tokens": 2}}\n')
    got = read_trace(path)
    assert [r.line for r in got.rows] == [2] and got.bad[0].reason.startswith("not usable JSON (")
    csv_path = tmp_path / "t.csv"
    csv_path.write_text(f"Timestamp,Request tokens,Response tokens\n1,{huge},3\n1,4,3\n")
    got = read_trace(csv_path)
    assert [r.line for r in got.rows] == [3] and len(got.bad[0].reason) < 80

# --- detection and whole-file errors -----------------------------------------------------------


@pytest.mark.parametrize("name, fmt", [
    ("sample.sharegpt.json", "sharegpt"), ("sample.burstgpt.csv", "burstgpt"), ("sample.azure.csv", "azure"),
    ("sample.mooncake.jsonl", "mooncake"), ("sample.jsonl", "jsonl"),
])
def test_detect_every_format_and_explicit_format_reads_the_same(name, fmt):
    assert detect(SAMPLES / name) == fmt
    assert detect(BAD / name.replace("sample", "bad")) == fmt
    assert read_trace(SAMPLES / name, fmt) == read_trace(SAMPLES / name)
    assert set(FORMATS) == {"sharegpt", "burstgpt", "azure", "mooncake", "jsonl"}


def test_unknown_content_names_the_formats(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("just some notes\n")
    assert one_line_error(read_trace, path) == (
        f"trace {path}: unknown format; set workload.format to one of sharegpt, burstgpt, azure, mooncake, jsonl")


def test_unknown_format_name_lists_the_valid_ones():
    message = one_line_error(read_trace, SAMPLES / "sample.jsonl", "csv")
    assert "'csv'" in message and "sharegpt, burstgpt, azure, mooncake, jsonl" in message


def test_missing_file_directory_and_undecodable_file(tmp_path):
    assert "no such file" in one_line_error(read_trace, tmp_path / "nope.jsonl")
    assert "is a directory" in one_line_error(read_trace, tmp_path)
    assert "is a directory" in one_line_error(read_trace, tmp_path, "jsonl")
    binary = tmp_path / "trace.jsonl"
    binary.write_bytes(b'{"output_tokens": 1, "prompt": "\xff\xfe"}\n')
    message = one_line_error(read_trace, binary, "jsonl")
    assert message.startswith(f"trace {binary}: cannot read it (") and message.endswith("; check the path")
    assert "cannot read it" in one_line_error(FORMATS["azure"], binary)  # the readers raise it too
    assert "cannot read it" in one_line_error(detect, binary)


def test_empty_file_header_only_and_all_rows_bad(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert one_line_error(read_trace, empty) == f"trace {empty}: the file is empty"
    assert "no usable rows as jsonl (0 malformed, 0 excluded)" in one_line_error(read_trace, empty, "jsonl")
    header = tmp_path / "header.csv"
    header.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n")
    assert "no usable rows as burstgpt (0 malformed, 0 excluded)" in one_line_error(read_trace, header)
    failures = tmp_path / "failures.csv"
    failures.write_text("Timestamp,Request tokens,Response tokens\n1,10,0\n2,abc,5\n")
    assert one_line_error(read_trace, failures, "burstgpt") == (
        f"trace {failures}: no usable rows as burstgpt (1 malformed, 1 excluded); "
        "first: line 3: Request tokens is not a number: 'abc'")


def test_csv_header_missing_a_column_names_it(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("Timestamp,Model,Request tokens,Total tokens\n1,ChatGPT,10,20\n")
    message = one_line_error(read_trace, path)
    assert "no 'Response tokens' column" in message and "Request tokens" in message


def test_sharegpt_must_be_one_json_array(tmp_path):
    obj = tmp_path / "obj.json"
    obj.write_text('{"conversations": []}')
    assert "JSON array" in one_line_error(read_trace, obj, "sharegpt")
    broken = tmp_path / "broken.json"
    broken.write_text('[{"conversations": [}]')
    assert one_line_error(read_trace, broken) == (
        f"trace {broken}: not valid JSON (Expecting value at line 1 column 21); a ShareGPT trace is one JSON array")
