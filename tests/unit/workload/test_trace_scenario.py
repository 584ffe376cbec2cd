"""workload/trace.py: a trace becomes requests of exactly the trace's token counts; malformed
rows stop the build unless skipped, and whatever is left out is said in the notes."""

import json
from pathlib import Path

import pytest

from optimizer.config.model_info import load_model_info
from optimizer.config.schema import build_config
from optimizer.errors import ConfigError
from optimizer.workload import Vocabulary, build_workload
from optimizer.workload.trace import MOONCAKE_BLOCK

ROOT = Path(__file__).resolve().parents[3]
SAMPLES, BAD = ROOT / "examples" / "traces", ROOT / "tests" / "fixtures" / "traces"


def build(tiny_model, **workload):
    cfg = build_config({"model": {"path": str(tiny_model)}, "workload": {"scenario": "trace", **workload}})
    model = load_model_info(str(tiny_model))
    return build_workload(cfg.workload, Vocabulary(model.vocab_size, model.source, model.max_positions))


def test_counts_are_exact_and_timestamps_keep_their_gaps(tiny_model, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in [
        {"timestamp": 100.0, "input_tokens": 50, "output_tokens": 7},
        {"timestamp": 101.5, "input_tokens": 3000, "output_tokens": 1},
        {"timestamp": 104.0, "input_tokens": 1, "output_tokens": 300}]))
    w = build(tiny_model, path=str(trace), arrival={"process": "trace", "time_scale": 0.5})
    assert [(len(r.prompt_token_ids), r.max_tokens) for r in w.requests] == [(50, 7), (3000, 1), (1, 300)]
    assert [r.offset_s for r in w.requests] == pytest.approx([0.0, 0.75, 2.0])
    assert w.concurrency is None and w.notes == ()


def test_text_prompts_use_the_models_tokenizer(tiny_model, tmp_path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(tiny_model) / "tokenizer.json"))
    text = "the cache holds every token of the prompt"
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"prompt": text, "output_tokens": 9}) + "\n")
    w = build(tiny_model, path=str(trace), arrival={"process": "closed", "concurrency": 1})
    assert w.requests[0].prompt_token_ids == tuple(tok.encode(text, add_special_tokens=False).ids)


def test_sharegpt_output_length_is_the_replys_token_count(tiny_model):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(tiny_model) / "tokenizer.json"))
    w = build(tiny_model, path=str(SAMPLES / "sample.sharegpt.json"), arrival={"process": "poisson", "rate": 2})
    first = json.loads((SAMPLES / "sample.sharegpt.json").read_text())[0]["conversations"]
    assert w.requests[0].max_tokens == len(tok.encode(first[1]["value"], add_special_tokens=False).ids)
    capped = build(tiny_model, path=str(SAMPLES / "sample.sharegpt.json"), max_output_tokens=20,
                   arrival={"process": "poisson", "rate": 2})
    assert max(r.max_tokens for r in capped.requests) == 20


def test_sharegpt_has_no_timestamps_so_trace_arrival_is_refused(tiny_model):
    with pytest.raises(ConfigError, match="no timestamps; set workload.arrival"):
        build(tiny_model, path=str(SAMPLES / "sample.sharegpt.json"))


def test_mooncake_equal_hash_ids_give_equal_blocks(tiny_model):
    rows = [json.loads(line) for line in (SAMPLES / "sample.mooncake.jsonl").read_text().splitlines() if line]
    w = build(tiny_model, path=str(SAMPLES / "sample.mooncake.jsonl"))
    blocks = {}
    for row, req in zip(rows, w.requests):
        assert len(req.prompt_token_ids) == row["input_length"] and req.max_tokens == row["output_length"]
        for i, h in enumerate(row["hash_ids"]):
            block = req.prompt_token_ids[i * MOONCAKE_BLOCK:(i + 1) * MOONCAKE_BLOCK]
            if len(block) == MOONCAKE_BLOCK:
                assert blocks.setdefault(h, block) == block
    shared = [h for h in blocks if sum(h in r["hash_ids"] for r in rows) > 1]
    assert shared  # the sample does share prefixes, so the check above compared something


def test_malformed_rows_refuse_with_line_numbers_unless_skipped(tiny_model):
    path = str(BAD / "bad.burstgpt.csv")
    with pytest.raises(ConfigError) as err:
        build(tiny_model, path=path)
    message = str(err.value)
    assert "\n" not in message and "malformed rows" in message and "--skip-bad-rows" in message
    assert "line 3:" in message
    w = build(tiny_model, path=path, skip_bad_rows=True)
    assert any("malformed rows skipped" in n and "line 3:" in n for n in w.notes)
    assert any("left out" in n for n in w.notes)  # the failure row is reported too, never dropped silently


def test_unknown_format_and_missing_file_are_one_line_errors(tiny_model, tmp_path):
    junk = tmp_path / "junk.txt"
    junk.write_text("hello\nworld\n")
    for path in (junk, tmp_path / "missing.jsonl"):
        with pytest.raises(ConfigError) as err:
            build(tiny_model, path=str(path))
        assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_max_requests_takes_the_first_rows(tiny_model):
    w = build(tiny_model, path=str(SAMPLES / "sample.azure.csv"), max_requests=5)
    assert len(w.requests) == 5 and w.requests[0].offset_s == 0.0


def test_max_requests_stops_building_at_the_cut_and_rows_past_the_model_are_bad(tiny_model, tmp_path):
    rows = [{"timestamp": i, "input_tokens": 10 + i, "output_tokens": 5} for i in range(6)]
    rows.insert(2, {"timestamp": 1.5, "input_tokens": 70000, "output_tokens": 5})  # past 65536 positions
    rows.append({"timestamp": 9, "input_tokens": 10 ** 10, "output_tokens": 5})  # past the cut: never built
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ConfigError, match=r"line 3: 70000 \+ 5 tokens exceed the model's 65536 positions"):
        build(tiny_model, path=str(trace), max_requests=4)
    w = build(tiny_model, path=str(trace), max_requests=4, skip_bad_rows=True)
    assert [r.id for r in w.requests] == ["line-1", "line-2", "line-4", "line-5"]
    assert [len(r.prompt_token_ids) for r in w.requests] == [10, 11, 12, 13]


def test_one_epoch_timestamp_among_relative_ones_is_refused_naming_its_row(tiny_model, tmp_path):
    rows = [{"timestamp": i * 0.5, "input_tokens": 20, "output_tokens": 4} for i in range(20)]
    rows[7]["timestamp"] = 1_733_390_000.0  # an epoch time among seconds from the start
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ConfigError, match=r"line 8's timestamp comes 1,733,389,990 s after the one before it "
                                          r"\(the trace's median gap is 0.5 s\)"):
        build(tiny_model, path=str(trace), arrival={"process": "trace"})
    # a night's lull in a real trace (10 h between bursts of 1 s gaps: 36,000x the median) is traffic, and kept
    quiet = [{"timestamp": i * 1.0 + (36_000.0 if i >= 10 else 0.0), "input_tokens": 20, "output_tokens": 4}
             for i in range(20)]
    trace.write_text("\n".join(json.dumps(r) for r in quiet))
    assert max(r.offset_s for r in build(tiny_model, path=str(trace), arrival={"process": "trace"}).requests) == 36_019.0
    # arrivals of their own ignore the timestamps: nothing to refuse
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    assert len(build(tiny_model, path=str(trace), arrival={"process": "poisson", "rate": 2}).requests) == 20


def test_a_trace_too_large_to_read_whole_is_refused_before_reading(tiny_model, tmp_path):
    big = tmp_path / "big.jsonl"
    with big.open("wb") as f:  # sparse: 2 GiB and one byte, nothing written
        f.truncate((2 << 30) + 1)
    with pytest.raises(ConfigError, match=r"big.jsonl: 2.0 GiB, past the 2 GiB a trace may hold \(it is read whole\)"):
        build(tiny_model, path=str(big), format="jsonl", arrival={"process": "poisson", "rate": 2})
