"""Whether a configuration lies where the twin was checked: near what it was calibrated on.

The validation (bench/twin_validation.py) predicts configurations from runs of the same workload
whose scheduler limits were within a factor of 8 of theirs, on the KV dtypes the calibration
measured. Outside that, the twin's errors were never measured, and it says so (the band doubles):

- a KV dtype family (16-bit or fp8) no calibration run used: its step costs are assumed to be the
  other family's;
- more sequences in a step than any calibration run held, by more than a quarter (its running
  peak: measured on the trial's /metrics, else its max-num-seqs). A run whose batch never moved
  cannot tell a step's fixed cost from its cost per sequence, so a larger batch is priced by a split
  the runs did not see: on the stored sets, TPOT p50 was off by a median 14.7% on such predictions
  against 6.4% on the others (BENCHMARKS.md). Said exactly when no calibration step held two;
- max-num-seqs or the token budget more than 8x above or below every calibration run's;
- an offered rate more than 2x the calibration runs' highest (a regime never seen: a deeper queue);
- a median prompt more than 8x longer than the calibration workload's: the cost of a prefill token
  is fitted on the lengths the runs saw, and extrapolated far past them (shorter prompts weigh it
  less, and stay inside);
- a KV block size no calibration run used, or another attention backend: the step cost does not
  depend on them, though the kernels' speed does;
- parallel ranks (tensor, pipeline or data parallel), speculative decoding, LoRA: not modelled.
"""

from __future__ import annotations

import statistics

from optimizer.twin.step_cost import is_fp8

FACTOR = 8.0
RATE_FACTOR = 2.0
BATCH_FACTOR = 1.25
BATCH_REASON = "a running batch of "  # how the batch rule's reasons begin (beyond_price)


def median_prompt(requests) -> float | None:
    """The median prompt length, in tokens, of a workload's requests (None for none)."""
    lengths = [len(r.prompt_token_ids) for r in requests]
    return float(statistics.median(lengths)) if lengths else None


def outside(shape, calibrated_shapes, params: dict, rate: float | None = None,
            calibrated_rate: float | None = None, prompt: float | None = None,
            calibrated_prompt: float | None = None, batch: float | None = None,
            calibrated_batch: float | None = None, data_parallel: bool = False) -> list[str]:
    """Why `shape` (a SchedulerShape) lies outside the envelope of `calibrated_shapes`; empty when inside.
    `prompt` and `calibrated_prompt` are median prompt lengths (median_prompt), where the workloads differ;
    `batch` the prediction's running peak (without it, only a batch where none was seen is said;
    with DP engines, `data_parallel`, one engine's peak),
    `calibrated_batch` the largest a calibration run held (Calibrated.largest_batch; without it, the
    calibration runs' largest max-num-seqs stands for it)."""
    out = []
    families = {is_fp8(s.kv_cache_dtype) for s in calibrated_shapes}
    if is_fp8(shape.kv_cache_dtype) not in families:
        out.append(f"KV dtype {shape.kv_cache_dtype} never calibrated (its costs assumed equal to "
                   f"{'fp8' if not is_fp8(shape.kv_cache_dtype) else '16-bit'}'s)")
    out += _batch_reason(shape, calibrated_shapes, batch, calibrated_batch)
    for name, label in (("max_num_seqs", "max-num-seqs"), ("max_num_batched_tokens", "max-num-batched-tokens")):
        seen = [getattr(s, name) for s in calibrated_shapes]
        value = getattr(shape, name)
        if seen and not (min(seen) / FACTOR <= value <= max(seen) * FACTOR):
            out.append(f"{label} {value} is more than {FACTOR:g}x from the calibrated {min(seen)}-{max(seen)}")
    if rate is not None and calibrated_rate and rate > calibrated_rate * RATE_FACTOR:
        out.append(f"rate {rate:g} req/s is more than {RATE_FACTOR:g}x the calibrated {calibrated_rate:g} req/s")
    if prompt and calibrated_prompt and prompt > calibrated_prompt * FACTOR:
        out.append(f"median prompt {prompt:.0f} tokens is more than {FACTOR:g}x the calibrated "
                   f"{calibrated_prompt:.0f} (the prefill cost is extrapolated)")
    blocks = {s.block_size for s in calibrated_shapes}
    if blocks and shape.block_size not in blocks:
        out.append(f"block size {shape.block_size} never calibrated (its kernels' speed assumed equal)")
    if params.get("attention-backend") not in (None, "", "auto"):
        out.append(f"attention-backend {params['attention-backend']}: its speed is not modelled")
    for knob in ("tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size"):
        if int(params.get(knob) or 1) > 1:
            out.append(f"data-parallel-size {params[knob]}: engines behind vLLM's balancer, checked against a real DP "
                       "server on a 2-core CPU only, where they were optimistic" if knob == "data-parallel-size"
                       and data_parallel else f"{knob} {params[knob]}: parallel ranks are not modelled")
    if params.get("speculative-config") not in (None, "", "off"):
        out.append("speculative decoding is not modelled")
    return out


def _batch_reason(shape, calibrated_shapes, batch: float | None, calibrated_batch: float | None) -> list[str]:
    """The batch rule (module docstring): [] inside, else its one reason."""
    if calibrated_batch is None and calibrated_shapes:
        calibrated_batch = max(s.max_num_seqs for s in calibrated_shapes)
    running = batch if batch is not None else shape.max_num_seqs
    if calibrated_batch is not None and calibrated_batch <= 1 and running > 1:
        return [f"{BATCH_REASON}{running:g}: no calibration run held two sequences in a step, so what a batch "
                "costs was never seen"]
    if batch is not None and calibrated_batch and batch > calibrated_batch * BATCH_FACTOR:
        return [f"{BATCH_REASON}{batch:g} is more than {BATCH_FACTOR:g}x the largest a calibration run held "
                f"({calibrated_batch:g}): what more sequences in a step cost is extrapolated"]
    return []


def beyond_price(reasons) -> list[str]:
    """The reasons that doubt more than the step's price: all but the batch rule's. Two configurations
    vLLM's scheduler runs step for step alike are priced alike whatever a step of that batch costs."""
    return [why for why in reasons or () if not why.startswith(BATCH_REASON)]
