"""workload/trace.py + traces/: an entry that is no request to replay (a ShareGPT question with
no answer, a BurstGPT failed request) is left out with a note naming every one of them, and
never stops a default run; a malformed row (wrong JSON, wrong types) still does."""

import json
from pathlib import Path

import pytest

from optimizer.cli import main
from optimizer.config.model_info import load_model_info
from optimizer.config.schema import build_config
from optimizer.errors import ConfigError
from optimizer.workload import Vocabulary, build_workload
from optimizer.workload.trace import spans
from optimizer.workload.traces import TraceError, read_trace

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "examples" / "traces"
POISSON = {"process": "poisson", "rate": 2}
SINGLE = "a single 'human' turn with no 'gpt' answer, so no output length"


def build(tiny_model, **workload):
    cfg = build_config({"model": {"path": str(tiny_model)}, "workload": {"scenario": "trace", **workload}})
    model = load_model_info(str(tiny_model))
    return build_workload(cfg.workload, Vocabulary(model.vocab_size, model.source, model.max_positions))


def answered(i: int) -> dict:
    return {"id": f"ok-{i}", "conversations": [{"from": "human", "value": f"Question {i}?"},
                                                {"from": "gpt", "value": f"Answer number {i}."}]}


def unanswered(i: int) -> dict:
    return {"id": f"single-{i}", "conversations": [{"from": "human", "value": f"Question {i} with no reply?"}]}


def sharegpt(tmp_path, entries) -> Path:
    path = tmp_path / "t.sharegpt.json"
    path.write_text(json.dumps(entries))
    return path


# --- ShareGPT: the shapes an entry can have -----------------------------------------------------


@pytest.mark.parametrize("turns, kind, reason", [
    ([], "excluded", "no turns (an empty conversation)"),
    ([{"from": "human", "value": "Hi?"}], "excluded", SINGLE),
    ([{"from": "gpt", "value": "Hi!"}, {"from": "human", "value": "Hello."}], "excluded",
     "no 'human' turn is followed by a 'gpt' answer, so no output length"),
    ([{"from": "human", "value": "a"}, {"from": "human", "value": "b"}], "excluded",
     "no 'human' turn is followed by a 'gpt' answer, so no output length"),
    ([{"from": "gpt", "value": "Hi!"}], "excluded", "no 'human' turn (its turns are from: gpt), so no prompt"),
    ([{"from": "user", "value": "Hi?"}, {"from": "assistant", "value": "Hi!"}], "excluded",
     "no 'human' turn (its turns are from: user, assistant), so no prompt"),
    ([{"from": "human", "value": "   "}, {"from": "gpt", "value": "Yes?"}], "excluded",
     "empty prompt (the human turn has no text)"),
    ([{"from": "human", "value": "Say nothing."}, {"from": "gpt", "value": ""}], "excluded",
     "empty reply (the gpt turn has no text, so no output length)"),
    (["just text"], "bad", "turn 1: not a JSON object (a str)"),
    ([{"from": "human", "value": ["a", "b"]}], "bad",
     "turn 1: 'from' and 'value' must be text, got 'human' and ['a', 'b']"),
    ([{"from": "human"}], "bad", "turn 1: 'from' and 'value' must be text, got 'human' and None"),
    ([{"from": "human", "value": ["a"]}, {"from": "gpt", "value": "ab"}], "bad", "turns 1 and 2: 'value' must be text"),
], ids=["empty", "single-turn", "gpt-first", "two-questions", "gpt-only", "other-roles", "empty-prompt", "empty-reply",
        "turn-not-object", "value-not-text", "no-value", "pair-value-not-text"])
def test_sharegpt_entry_shapes_are_excluded_or_malformed(tmp_path, turns, kind, reason):
    got = read_trace(sharegpt(tmp_path, [answered(1), {"id": "x", "conversations": turns}]))
    assert [r.line for r in got.rows] == [1]
    assert {b.line: b.reason for b in getattr(got, kind)} == {2: reason}
    assert not getattr(got, "bad" if kind == "excluded" else "excluded")


def test_a_later_answered_pair_is_still_replayed(tmp_path):
    turns = [{"from": "gpt", "value": "Welcome."}, {"from": "human", "value": "Name a prime."},
             {"from": "gpt", "value": "7"}]
    got = read_trace(sharegpt(tmp_path, [{"conversations": turns}]))
    assert [(r.line, r.prompt, r.output_text) for r in got.rows] == [(1, "Name a prime.", "7")]
    assert not got.bad and not got.excluded


# --- the build: left out with a note, never refused -----------------------------------------------


def test_single_turn_entries_do_not_block_a_default_run_and_are_named(tiny_model, tmp_path):
    path = sharegpt(tmp_path, [answered(1), unanswered(2), answered(3), answered(4), unanswered(5)])
    w = build(tiny_model, path=str(path), arrival=POISSON)  # no skip_bad_rows
    assert [r.id for r in w.requests] == ["line-1", "line-3", "line-4"]
    assert w.notes == (f"2 entries left out, not replayable: entries 2, 5: {SINGLE}",)


def test_many_left_out_entries_are_all_named_in_a_compact_form(tiny_model, tmp_path):
    skipped = {3, 7, 12, 13, 14, 15}
    entries = [unanswered(i) if i in skipped else answered(i) for i in range(1, 21)]
    entries[19] = {"id": "empty", "conversations": []}  # entry 20: another reason, its own group
    w = build(tiny_model, path=str(sharegpt(tmp_path, entries)), arrival=POISSON)
    assert len(w.requests) == 13
    assert w.notes == ((f"7 entries left out, not replayable: entries 3, 7, 12-15: {SINGLE}; "
                        "entry 20: no turns (an empty conversation)"),)


def test_burstgpt_failures_are_left_out_the_same_way(tiny_model):
    w = build(tiny_model, path=str(SAMPLES / "sample.burstgpt.csv"))
    assert len(w.requests) == 38
    assert w.notes == ("2 lines left out, not replayable: lines 10, 28: logged as a failure (Response tokens 0)",)


def test_malformed_entries_still_block_and_unanswered_ones_are_not_counted_as_malformed(tiny_model, tmp_path):
    path = sharegpt(tmp_path, [answered(1), unanswered(2), "not an entry",
                               {"conversations": [{"from": "human", "value": 5}, {"from": "gpt", "value": "x"}]}])
    with pytest.raises(ConfigError) as err:
        build(tiny_model, path=str(path), arrival=POISSON)
    assert str(err.value) == (f"trace {path}: 2 malformed rows (line 3: not a JSON object (a str); line 4: turns 1 "
                              "and 2: 'value' must be text); fix them or pass --skip-bad-rows to replay the rest")
    w = build(tiny_model, path=str(path), arrival=POISSON, skip_bad_rows=True)
    assert [r.id for r in w.requests] == ["line-1"]
    assert w.notes == (("2 malformed rows skipped (line 3: not a JSON object (a str); line 4: turns 1 and 2: "
                        "'value' must be text)"),
                       f"1 entry left out, not replayable: entry 2: {SINGLE}")


def test_more_skipped_malformed_rows_than_shown_are_all_named(tiny_model, tmp_path):
    rows = [{"input_tokens": 10, "output_tokens": 5}] + [{"input_tokens": "x", "output_tokens": 5}] * 7
    rows += [{"input_tokens": 12, "output_tokens": 5}, {"input_tokens": "y", "output_tokens": 5}]
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    w = build(tiny_model, path=str(trace), skip_bad_rows=True, arrival=POISSON)
    assert [r.id for r in w.requests] == ["line-1", "line-9"]
    (note,) = w.notes
    assert note.startswith("8 malformed rows skipped (line 2: input_tokens is not a number: 'x'; ")
    assert note.endswith("; and 3 more); all of them: lines 2-8, 10")


def test_excluded_rows_past_max_requests_are_not_named(tiny_model, tmp_path):
    path = sharegpt(tmp_path, [answered(1), unanswered(2), answered(3), answered(4), unanswered(5)])
    w = build(tiny_model, path=str(path), arrival=POISSON, max_requests=2)
    assert [r.id for r in w.requests] == ["line-1", "line-3"]
    assert w.notes == (f"1 entry left out, not replayable: entry 2: {SINGLE}",)


def test_a_trace_of_only_unanswered_entries_is_one_line_naming_the_first(tmp_path):
    path = sharegpt(tmp_path, [unanswered(1), unanswered(2)])
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert str(err.value) == (f"trace {path}: no usable rows as sharegpt (0 malformed, 2 excluded); "
                              f"first excluded: line 1: {SINGLE}")
    assert err.value.exit_code == 2


def test_the_workload_command_prints_the_note_and_writes_it(tiny_model, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = sharegpt(tmp_path, [answered(1), unanswered(2), answered(3)])
    (tmp_path / "study.yaml").write_text(f"model: {{path: {tiny_model}}}\nworkload: {{scenario: trace, path: {path}, "
                                         "arrival: {process: poisson, rate: 2}}\n")
    code = main(["workload", "--config", "study.yaml", "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 0 and captured.err == ""
    assert f"  note: 1 entry left out, not replayable: entry 2: {SINGLE}" in captured.out.splitlines()
    (written,) = (tmp_path / "out").glob("workload-*.jsonl")
    header = json.loads(written.read_text().splitlines()[0])
    assert header["notes"] == [f"1 entry left out, not replayable: entry 2: {SINGLE}"]


@pytest.mark.parametrize("numbers, text", [
    ([3, 7, 12, 13, 14, 15], "3, 7, 12-15"), ([5], "5"), ([2, 1, 3, 3], "1-3"), ([1, 3, 5], "1, 3, 5"), ([], ""),
])
def test_spans_fold_runs(numbers, text):
    assert spans(numbers) == text
