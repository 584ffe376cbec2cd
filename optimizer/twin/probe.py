"""The step probe: a few seconds of requests, sent after a run, that tell the twin what a batch costs.

A run of the study's workload often holds the same number of sequences in every decode step (a
closed loop keeps the batch full; a server at max-num-seqs 1 holds one), and then its timings
cannot tell a step's fixed cost from its cost per decoding sequence: the twin prices other batches
from a guess (docs/twin.md, "Fitting"). The probe decodes at batches that differ, on the same
server, right after its measured run:

    1 sequence, a quarter of max-num-seqs, and max-num-seqs (at most PROBE_MAX_BATCH) sequences,
    each sent at once with prompts of the workload's median length and OUTPUT tokens (ignore_eos):
    the batches priced at the context the workload's own steps attend to;
    then LONG_SEQS sequences over prompts LONG_FACTOR times as long, for the cost of that context.

The trial sends them (trial/step_probe.py). Each group runs alone (the one before has ended), so
each is one calibration run of its own at its real send times. Of a group of several, only the
decode spans (first token to last) are fitted: its requests arrive at once, and the API server
takes such a burst one request after the other, a wait the twin's intake time (one constant per
request) does not model. The lone request's first token is fitted too: on an idle server it is the
intake and one prefill step, the one time in a study that tells the intake apart from queueing.
Prompts are token ids drawn from the workload's own prompts (valid for the model, no tokenizer
needed), random enough that no 16-token block repeats: no prefix-cache hits.
"""

from __future__ import annotations

import random

from optimizer.workload.base import Request, Workload

OUTPUT = 64  # tokens each decoding sequence generates
MIN_PROMPT = 16
LONG_FACTOR = 4  # the long group's prompts, times the median (at most half of max-model-len)
LONG_SEQS = 4
LONG_OUTPUT = 32
PROBE_MAX_BATCH = 64  # the largest group: bounds the probe's time on a server with a huge max-num-seqs


def batches(max_num_seqs: int) -> list[int]:
    """The decode batches probed: 1, a quarter of max-num-seqs and max-num-seqs (capped), distinct."""
    top = max(1, min(int(max_num_seqs), PROBE_MAX_BATCH))
    return sorted({1, max(1, top // 4), top})


def build(workload: Workload, max_num_seqs: int, max_model_len: int, seed: int = 0) -> tuple[tuple[Request, ...], ...]:
    """The probe's groups for a server with these limits; () when the workload has no prompt to draw ids from."""
    pool = sorted({t for r in workload.requests[:200] for t in r.prompt_token_ids})
    if len(pool) < 2:
        return ()
    lengths = sorted(len(r.prompt_token_ids) for r in workload.requests)
    half = max(MIN_PROMPT, max_model_len // 2 - OUTPUT)
    prompt = min(half, max(MIN_PROMPT, lengths[len(lengths) // 2]))
    rng = random.Random(seed)
    groups = [_group(rng, pool, k, prompt, OUTPUT) for k in batches(max_num_seqs)]
    long_prompt = min(LONG_FACTOR * prompt, max(MIN_PROMPT, max_model_len // 2 - LONG_OUTPUT))
    if long_prompt > prompt:
        groups.append(_group(rng, pool, min(LONG_SEQS, max(1, int(max_num_seqs))), long_prompt, LONG_OUTPUT))
    return tuple(groups)


def _group(rng: random.Random, pool: list[int], k: int, prompt: int, output: int) -> tuple[Request, ...]:
    return tuple(Request(f"probe-{k}x{prompt}-{i}", _ids(rng, pool, prompt), output, 0.0) for i in range(k))


def for_server(workload: Workload, args: list[str], max_positions: int) -> tuple[tuple[Request, ...], ...]:
    """The groups for a server started with `args`: vLLM's default max-num-seqs (256) where the
    flag is not set, the model's positions where max-model-len is not."""
    from optimizer.config.flags import from_cli_args

    flags = from_cli_args(list(args))
    return build(workload, int(flags.get("max-num-seqs") or 256), int(flags.get("max-model-len") or max_positions))


def _ids(rng: random.Random, pool: list[int], n: int) -> tuple[int, ...]:
    return tuple(rng.choice(pool) for _ in range(n))


def measured_runs(label: str, server, groups: tuple, rows: list[list[list]]) -> list:
    """The probe's groups as calibration runs of `server` (twin/fit.py MeasuredRun), those that finished."""
    from optimizer.twin.fit import MeasuredRun

    runs = []
    for i, (group, got) in enumerate(zip(groups, rows)):
        if len(got) != len(group) or not all(r[5] and r[3] == len(q.prompt_token_ids) for r, q in zip(got, group)):
            continue  # a failed request, or groups built otherwise than these (another workload)
        times = [(r[0], r[1], r[2], int(r[4]), bool(r[5])) for r in got]
        runs.append(MeasuredRun(f"{label} probe {i}", server, tuple(group), times, spans_only=len(group) > 1))
    return runs
