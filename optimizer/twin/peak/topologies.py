"""Data-parallel sizes a study did not measure, predicted for the configuration a plan rests on: DP N
engines behind vLLM's balancer (twin/peak/data_parallel.py), against the same twin as one engine.

A size's rate is the measured engine's rate times what the twin says N engines carry against one
(each one's capacity with the SLOs holding, twin/peak/capacity.py, on the study's own requests): the
measurement anchors the figure, the twin gives only the ratio. N engines replay the study's requests
N times over (`tiled`), so that each engine sees as many as the one engine did: a capacity read on
a few dozen requests is partly their ramp and drain, and N engines sharing the same few dozen would
read mostly that. Each copy's prompts are the study's with every token id moved on by the copy's
number: prefixes shared within the study's requests stay shared within each copy, and no copy hits
the prefix cache on another's (the one engine it is compared with never saw a prompt twice). Its tails at the rate each replica gets at peak, and its knee, follow as one
engine's do (twin/peak/tails.py). Their bands are one engine's, doubled, as outside the validated
envelope: no real DP server on a GPU has checked them, and on a CPU one found them optimistic
(CPU_CHECKED).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from optimizer.twin.peak.capacity import capacity
from optimizer.twin.peak.data_parallel import DataParallel
from optimizer.twin.peak.tails import TAILS, Tails, open_loop, tails, ttft_slo

DEFAULT_SIZES = (2, 4)
NOT_VALIDATED = "no real data-parallel server on a GPU has checked the twin's DP yet"
# bench/dp_twin.py, four times, the 2-core AVX-512 EPYC, 2026-12-07 (BENCHMARKS.md, "Data-parallel engines").
CPU_CHECKED = ("on a 2-core CPU a real DP 2 server carried 1.35-1.64x one engine's throughput where the twin said "
               "1.76-1.92x (on bursts, as this ratio is read: 1.55x against 2.00x): its engines' host-side work and "
               "its API servers share the engines' cores, which the twin does not model (bench/dp_twin.py)")


@dataclass(frozen=True)
class PredictedDp:
    size: int  # engines
    ratio: float  # the rate N engines carry against one engine's, the twin's (0: N engines carry none)
    tails: Tails  # each replica's at its share of the peak
    one_carries: bool = True  # whether one engine keeps the SLOs at some rate (else there is no ratio)
    band: float = 0.0  # the ratio's (and the rate's) band, a share either way: one engine's throughput band x2


def predicted_dp(server, cost, requests: tuple, slos: tuple, sizes, peak_for, table: dict) -> list[PredictedDp]:
    """For each size n: its ratio to one engine and its tails at `peak_for(ratio, n)` requests/s a replica.
    `table` is the band (metric -> share) of one engine's predictions; doubled here."""
    one = capacity(server, cost, open_loop(requests), slos).rate
    out = []
    for n in sizes:
        dp, many = DataParallel(server, n), tiled(open_loop(requests), n, server.model.vocab_size)
        cap = capacity(dp, cost, many, slos)
        ratio = cap.rate / one if one > 0 else 0.0
        knee = cap if all(s is ttft_slo(slos) for s in slos) else None  # the knee's own search: the same
        got = tails(dp, cost, many, peak_for(ratio, n), slos, knee=knee)
        bands = {m: (v / (1 + 2 * table[m]), v * (1 + 2 * table[m])) for m, v in got.metrics.items()
                 if m in TAILS and m in table}
        out.append(PredictedDp(n, ratio, replace(got, bands=bands, outside=(NOT_VALIDATED,)), one > 0,
                               2 * table.get("request_throughput", 0.0)))
    return out


def tiled(stream: tuple, n: int, vocab: int) -> tuple:
    """An open-loop `stream` n times over, each copy after the last (its first turns' offsets shifted by
    the stream's span and one mean gap), ids and the turns they follow suffixed with the copy, and copy
    k's token ids moved on by k (modulo `vocab`): no prompt of one copy shares a block with another's."""
    roots = [r.offset_s for r in stream if r.after is None]
    span = max(roots, default=0.0)
    step = span + (span / (len(roots) - 1) if len(roots) > 1 else 1.0)
    return tuple(replace(r, id=f"{r.id}#{k}", after=None if r.after is None else f"{r.after}#{k}",
                         offset_s=r.offset_s + k * step if r.after is None else r.offset_s,
                         prompt_token_ids=tuple((t + k) % vocab for t in r.prompt_token_ids))
                 for k in range(n) for r in stream)
