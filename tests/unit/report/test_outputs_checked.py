"""What the output check found is said on every surface even when it found nothing: the trial's
console line, the written report's "Outputs checked" section (text/outputs.py,
report/outputs_checked.py). The records are made by the gate's own comparison (outputs/gate.py)."""

from __future__ import annotations

import io

import optuna
from rich.console import Console

from objectives import get_objective
from optimizer.driver.progress import Progress
from optimizer.outputs.compare import Output
from optimizer.outputs.gate import _compared
from optimizer.record import of_trial
from optimizer.report import outputs_checked
from optimizer.text.outputs import checked
from optimizer.trial.spec import TrialResult


def _out(i, tokens, batch=1):
    return Output(i, tuple(f"token_id:{t}" for t in tokens), tuple(-0.1 for _ in tokens),
                  tuple({f"token_id:{t}": -0.1, "token_id:999": -0.4} for t in tokens), batch)


ANSWERS = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]]  # four prompts, 4 tokens each


def _run(answers, batch=None):
    alone = [_out(i, t) for i, t in enumerate(answers)]
    return alone + ([_out(i, t, batch) for i, t in enumerate(answers)] if batch else [])


def _record(candidate, speculates=False, batch=None):
    record, _, summary = _compared(_run(ANSWERS, batch), candidate, speculates)
    return {**record, "summary": summary}


def test_no_flip_is_said_with_the_tokens_compared():
    assert checked(_record(_run(ANSWERS))) == "answers unchanged: 0 of 16 tokens flipped"


def test_a_speculating_trial_says_both_sides_it_was_compared_on():
    record = _record(_run(ANSWERS, 4), speculates=True, batch=4)
    assert checked(record) == "answers unchanged: 0 of 32 tokens flipped, alone and 4 at a time"


def test_flips_keep_the_checks_own_summary_and_nothing_compared_says_why():
    flipped = [[1, 2, 3, 4], [5, 6, 0, 8], [9, 10, 11, 12], [13, 14, 15, 16]]
    record = _record(_run(flipped))
    assert checked(record) == record["summary"] and record["summary"].startswith("top-1 flip rate 0.067 (1 of 15 tokens")
    assert checked({"summary": "the reference: the other trials' outputs are compared with these"}).startswith("the ref")
    assert checked({}) is None


def _study():
    study = optuna.create_study(direction="maximize")
    for n, record in enumerate(({"summary": "the reference: the other trials' outputs are compared with these"},
                                _record(_run(ANSWERS)), None)):
        t = study.ask()
        t.set_user_attr("vllm_args", ["--max-num-seqs", str(8 * (n + 1))])
        if record:
            of_trial.write_regression(t, record)
        study.tell(t, 100.0 + n)
    return study


def test_the_report_section_lists_every_checked_trial():
    class Doc:
        def __init__(self):
            self.parts = []

        def heading(self, text, level=2):
            self.parts.append(("h", text))

        def para(self, text):
            self.parts.append(("p", text))

        def table(self, headers, rows):
            self.parts.append(("t", headers, rows))

    doc = Doc()
    outputs_checked.section(doc, _study().get_trials(deepcopy=False))
    assert doc.parts[0] == ("h", "Outputs checked")
    rows = doc.parts[2][2]
    assert rows == [["0", "COMPLETE", "the reference: the other trials' outputs are compared with these"],
                    ["1", "COMPLETE", "answers unchanged: 0 of 16 tokens flipped"]]  # trial 2 was not checked
    empty = Doc()
    outputs_checked.section(empty, optuna.create_study().get_trials())
    assert empty.parts == []


def test_the_console_line_of_a_completed_trial_says_what_the_check_found():
    study, out = _study(), io.StringIO()
    progress = Progress(Console(file=out, width=200))
    obj = get_objective("throughput")
    result = TrialResult(1, None, {"output_throughput": 101.0, "ttft_ms_p95": 1.0, "tpot_ms_p95": 1.0,
                                   "error_rate": 0.0}, {"startup_s": 1.0})
    progress.trial_done(study, 1, result, optuna.trial.TrialState.COMPLETE, obj)
    progress.trial_done(study, 2, result, optuna.trial.TrialState.COMPLETE, obj)
    lines = out.getvalue().splitlines()
    assert lines[1] == "    outputs: answers unchanged: 0 of 16 tokens flipped" and len(lines) == 3
