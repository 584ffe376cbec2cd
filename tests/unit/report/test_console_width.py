"""report/console.py at 80 columns (what rich gives output that is not a terminal: a pipe, a log, a
Ray job): no table cuts a knob name or value to an ellipsis; the other columns narrow or wrap."""

from types import SimpleNamespace

import optuna
from rich.console import Console

from objectives import LatencyObjective
from optimizer.driver.progress import Progress
from optimizer.measure.slo import parse_slos
from optimizer.record.remeasured import Confirmation
from optimizer.report import console as report

COMPLETE, PRUNED = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED
BASE = ["--gpu-memory-utilization", "0.5", "--max-num-seqs", "8", "--enforce-eager"]
WIDE = ["--max-num-seqs", "64", "--gpu-memory-utilization", "0.45", "--max-model-len", "8192", "--kv-cache-dtype",
        "fp8_e4m3", "--enable-chunked-prefill", "--max-num-batched-tokens", "16384", "--no-enable-prefix-caching",
        "--attention-backend", "FLASHINFER", "--enforce-eager"]
WHOLE = ["gpu-memory-utilization=0.5", "max-num-seqs=64", "gpu-memory-utilization=0.45", "max-model-len=8192",
         "kv-cache-dtype=fp8_e4m3", "enable-chunked-prefill=True", "max-num-batched-tokens=16384",
         "enable-prefix-caching=False", "attention-backend=FLASHINFER"]


def _trial(number, state, args, value=None, **attrs):
    return optuna.trial.create_trial(state=state, value=value, user_attrs={"vllm_args": args, **attrs})


def _study() -> optuna.Study:
    study = optuna.create_study(study_name="a-study-with-a-long-name", direction="minimize")
    study.add_trial(_trial(0, COMPLETE, BASE, 250.0, baseline=True))
    study.add_trial(_trial(1, COMPLETE, WIDE, 1234.5))
    study.add_trial(_trial(2, PRUNED, WIDE[:6], failure_kind="kv_too_small", precheck="pruned"))
    study.add_trial(_trial(3, COMPLETE, WIDE, 1234.5, repeat_of=1))
    study.add_trial(_trial(4, PRUNED, WIDE, failure_kind="output_changed"))
    return study


def _at_80() -> Console:
    return Console(width=80, force_terminal=False, record=True)


def _assert_uncut(text: str, *whole: str) -> None:
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80
    missing = [w for w in whole if w not in text]
    assert not missing, f"cut or broken: {missing}\n{text}"


def test_the_trials_table_keeps_every_knob_whole_at_80_columns():
    con = _at_80()
    con.print(report._trials_table(_study(), LatencyObjective("ttft_p95", parse_slos("tpot:50"))))
    text = con.export_text()
    _assert_uncut(text, *WHOLE, "kv_too_small", "(predicted)", "output_changed", "1234.5", "ttft_p95")
    assert "repeat" in text and "baseline" in text and "COMPLETE" in text


def test_what_mattered_keeps_knob_names_and_values_whole_at_80_columns(monkeypatch):
    rows = [("gpu-memory-utilization", "0.5", "0.45", "1.03x [0.80, 1.32] over 1 run", "reverted", "trial 3"),
            ("enable-chunked-prefill", "(vLLM default)", "True", "0.61x [0.52, 0.70] over 2 runs", "kept",
             "minimal/config-1/run-0, minimal/config-1/run-1"),
            ("attention-backend", "(vLLM default)", "FLASHINFER", "0.98x [0.85, 1.13] over 1 run", "reverted", ""),
            ("all reverted together", "", "", "0.97x [0.90, 1.05] over 2 runs", "reverted", "")]
    monkeypatch.setattr(report, "attribution", lambda rec: rows)
    rec = SimpleNamespace(values=(119.0,), source="minimal change", value=119.0, changed_from_trial=True, rows=rows)
    s = SimpleNamespace(recommendation=rec, best=SimpleNamespace(number=1), confirmation=Confirmation())
    con = _at_80()
    report._print_best(s, LatencyObjective("ttft_p95"), con)
    text = con.export_text()
    _assert_uncut(text, *(word for row in rows for cell in row[:3] + row[4:5] for word in cell.split()))
    assert text.count("reverted") == 4 and "kept" in text  # each verdict whole (and the combined row's knob)
    # The runs each row rests on, below the table, whole.
    assert "gpu-memory-utilization rests on: trial 3" in text
    assert "enable-chunked-prefill rests on: minimal/config-1/run-0," in text and "minimal/config-1/run-1" in text


def test_progress_lines_wrap_between_knobs_never_inside_one():
    con = _at_80()
    knobs = {"max-num-seqs": 64, "gpu-memory-utilization": 0.45, "max-model-len": 8192, "kv-cache-dtype": "fp8_e4m3",
             "enable-chunked-prefill": True, "max-num-batched-tokens": 16384, "attention-backend": "FLASHINFER"}
    Progress(con).trial_started(12, 12, 40, knobs, baseline=False)
    _assert_uncut(con.export_text(), *(f"{k}={v}" for k, v in knobs.items()))
