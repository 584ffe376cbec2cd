"""The written report's what-if table: for the devices the config's `whatif.report` names, what one
replica of the study's model would carry at the study's request shape, predicted and marked so.

The request shape is the recommended (or best) trial's: prompt and output tokens a request from
its token rates. The capacity and its terms are `plan --what-if`'s (whatif/fleet_rows.py), without
a peak (no replica count); the calibration is the study's own (whatif/study_calibration.py). A
prediction that cannot be made (the model's config unreadable, a TP the heads refuse) is one
sentence in the section, never a failed report.
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.errors import ConfigError
from optimizer.measure.slo import Slo
from optimizer.measure.slo import describe as describe_slos
from optimizer.record import of_trial
from optimizer.whatif import architecture, devices, fleet_rows
from optimizer.whatif.predict import DEFAULT_TPS, tp_allowed
from optimizer.whatif.roofline import Serving
from optimizer.whatif.study_calibration import from_study, load_of

TITLE = "What-if: GPUs this study did not run on (predicted)"


@dataclass(frozen=True)
class Section:
    title: str
    paragraphs: tuple[str, ...]
    headers: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()


def _shape(study) -> tuple[int, int] | None:
    if len(study.directions) > 1:
        raise ConfigError("a multi-objective study has no one best trial whose request shape to predict for; "
                          "use `plan --what-if --trial N`")
    try:
        best = study.best_trial
    except ValueError:  # no feasible trial
        return None
    load = load_of(of_trial.metrics(best))
    return (load.isl, load.osl) if load else None


def section(study, model: str, spec, slos: tuple[Slo, ...]) -> Section | None:
    """The section, or None when the config asks for no what-if in the report; never raises."""
    if not spec.report:
        return None
    try:
        return _section(study, model, spec, slos)
    except ConfigError as exc:
        return Section(TITLE, (f"Not predicted: {exc}",))
    except Exception as exc:  # noqa: BLE001 - whatever the estimate trips on, the rest of the report is written
        return Section(TITLE, (f"Not predicted: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}",))


def _section(study, model: str, spec, slos: tuple[Slo, ...]) -> Section:
    custom = {k.lower(): v for k, v in spec.devices.items()}
    chosen = [devices.custom(n.lower(), custom[n.lower()]) if n.lower() in custom else devices.known(n)
              for n in spec.report]
    arch = architecture.load(model)
    tps = list(spec.tp) or [t for t in DEFAULT_TPS if tp_allowed(arch, t)]
    shape = _shape(study)
    if shape is None:
        return Section(TITLE, ("No completed trial measured a request shape to predict for.",))
    isl, osl = shape
    cal = from_study(study, model, arch)
    rows = fleet_rows.rows(model, arch, chosen, tps, Serving(), isl, osl, cal, slos, 1.0, 0.0, {})
    band = {m: f"+-{cal.percent(m):.0%}" for m in ("ttft_s", "tpot_s", "throughput")}
    text = (f"Every figure here is predicted, not measured: {arch.name} at {isl:,} prompt + {osl:,} output tokens "
            f"a request (the best trial's), vLLM's GPU defaults (max-num-seqs 256, memory fraction 0.9). "
            f"Capacity: the highest predicted throughput whose mean TTFT and TPOT keep "
            f"{describe_slos(slos) if slos else 'no SLO (none given: the largest load)'}. "
            f"Bands where calibrated: TTFT {band['ttft_s']}, TPOT {band['tpot_s']}, throughput {band['throughput']}; "
            f"each row's own is beside its capacity. "
            f"Calibration: {cal.basis}. How it predicts: docs/what-if.md; `plan --what-if` adds replicas and cost.")
    table = tuple((r.device.name, str(r.tp), f"{r.requests_per_s:.3g}", f"+-{r.band:.0%}", str(r.concurrency),
                   f"{r.ttft_s * 1e3:.3g}", f"{r.tpot_s * 1e3:.3g}", f"{r.kv_tokens:,}", r.by) if r.usable else
                  (r.device.name, str(r.tp), "-", "-", "-", "-", "-", f"{r.kv_tokens:,}", r.why) for r in rows)
    return Section(TITLE, (text,), ("device", "TP", "req/s a replica", "its band", "in flight", "TTFT ms", "TPOT ms",
                                    "KV tokens", "by"), table)
