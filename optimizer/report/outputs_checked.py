"""The written report's "Outputs checked" section: each trial's greedy answers against the
baseline's, in the words of text/outputs.py, shown even when nothing flipped."""

from __future__ import annotations

from optimizer.record import of_trial
from optimizer.text.outputs import checked

TITLE = "Outputs checked"
HEADERS = ("trial", "state", "answers against the baseline's")


def rows(trials) -> list[list[str]]:
    out = []
    for t in trials:
        phrase = checked(of_trial.regression(t))
        if phrase:
            out.append([str(t.number), t.state.name, phrase])
    return out


def section(doc, trials) -> None:
    """The section (`doc`: report/written.py's document), when the study checked outputs."""
    if found := rows(trials):
        doc.heading(TITLE)
        doc.para("The same prompts answered greedily by each trial and by the baseline, compared token by token "
                 "up to each answer's first top-1 flip (the study's `regression` section).")
        doc.table(list(HEADERS), found)
