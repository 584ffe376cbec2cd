"""What the output check found on a trial, in one phrase, said even when it found nothing:
"answers unchanged: 0 of 96 tokens flipped, alone and 4 at a time"."""

from __future__ import annotations


def checked(record: dict) -> str | None:
    """The phrase for a trial's stored output-check record (record/of_trial.regression): no flip
    in so many compared tokens, else the check's own summary (the flips, where they start), or
    why nothing was compared; None when the check did not run on it."""
    if not record:
        return None
    spec = record.get("speculation")
    if spec:  # a speculating trial: alone and at the batch size, each against the baseline at it
        alone, batched = spec["alone"], spec["batched"]
        if alone["flips"] or batched["flips"]:
            return record.get("summary")
        tokens = alone["compared_tokens"] + batched["compared_tokens"]
        return f"answers unchanged: 0 of {tokens} tokens flipped, alone and {spec['batch']} at a time"
    if "compared_tokens" in record:
        if record.get("flips"):
            return record.get("summary")
        return f"answers unchanged: 0 of {record['compared_tokens']} tokens flipped"
    return record.get("summary")  # the reference itself, or why it was not compared
