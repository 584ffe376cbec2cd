"""The daemon's forecast: when the traffic changes, will the configuration production runs still
hold the SLOs on it? Answered by the twin before anything boots, and checked afterwards.

When a change starts generation N+1, the twin calibrated on generation N's own runs
(twin/from_study.py: its baseline's run, and one of the other KV dtype) replays generation N+1's
workload, the new window's requests at their observed arrival times, with production's
configuration: the recommendation last published (the daemon's `/recommendation`), else the
config's baseline. The forecast holds the predicted latencies with their bands and, per SLO of the
objective at its own percentile, whether it holds; the verdict is `breaks` when any SLO is
predicted broken, `holds` when none is, and `sure` when no band crosses a limit and the new
traffic lies inside the calibration's envelope (outside it the twin's error was never measured). The error SLO is
not forecast (the twin has no failures). Without SLOs the forecast holds the latencies alone.

The bands are the twin's validated ones (twin/prediction.py): calibrated on one run, the one-run
band; a configuration outside the calibration's envelope doubles them.

The generation's warm starts are booted in the twin's predicted order on the new workload, best
first (`ordered`). When the generation has run, the trial that booted the forecast configuration
(the baseline trial for the baseline, else the first trial with the same knobs) is its measurement:
`against_measured` adds that trial's latencies, its verdict, and the forecast's |error| per
metric; stored on the generation's study (record/of_generation.py) and shown in `/status`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from optimizer.config.flags import from_cli_args, to_cli_args
from optimizer.driver.plan import baseline_params
from optimizer.errors import first_line
from optimizer.measure.slo import Slo
from optimizer.record import of_trial
from optimizer.verdict.trials import COMPLETE, knobs_of

SHOWN = ("ttft_ms_p50", "ttft_ms_p95", "tpot_ms_p50", "tpot_ms_p95", "e2el_ms_p95", "request_throughput")
HEADLINE = "ttft_ms_p95"  # the figure whose forecast error the daemon reports
EARLIER = 3  # generations looked back on for runs to calibrate on


@dataclass(frozen=True)
class Forecast:
    of: str  # "the published recommendation" | "the baseline"
    params: dict
    calibrated_on: str  # the study and trials whose runs fitted the step cost
    metrics: dict  # metric -> [predicted, low, high]
    slos: list  # per latency SLO: {"slo", "metric", "limit", "predicted", "low", "high", "holds", "sure"}
    verdict: str  # holds | breaks | no SLOs
    sure: bool
    outside: list = field(default_factory=list)
    measured: dict | None = None  # filled by against_measured

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """One line: the verdict, and the SLO that decides it (or the headline latency without SLOs),
        and where the new traffic lies outside what the twin was calibrated on (its band doubled)."""
        outside = f"; outside the calibration ({'; '.join(self.outside)}): band doubled" if self.outside else ""
        return self._verdict() + outside

    def _verdict(self) -> str:
        if not self.slos:
            v, lo, hi = self.metrics[HEADLINE]
            if v is None:
                return "no SLOs to judge, and no p95 TTFT predicted"
            return f"p95 TTFT {v:.0f} ms [{lo:.0f}, {hi:.0f}] (no SLOs to judge)"
        deciding = [s for s in self.slos if not s["holds"]] or self.slos
        worst = max(deciding, key=lambda s: math.inf if s["predicted"] is None else s["predicted"] / s["limit"])
        certainty = ("" if self.sure else " (unsure: outside the calibration)" if self.outside
                     else " (the band reaches past the limit)")
        if worst["predicted"] is None:
            return f"{self.verdict}{certainty}: {worst['slo']}, not predicted"
        return (f"{self.verdict}{certainty}: {worst['slo']}, predicted {worst['predicted']:.0f} ms "
                f"[{worst['low']:.0f}, {worst['high']:.0f}]")


def current_params(published: dict | None, baseline: dict) -> tuple[str, dict]:
    """(which, its knobs): the published recommendation's flags, else the config's baseline."""
    flags = (published or {}).get("flags")
    if flags:
        return "the published recommendation", from_cli_args(list(flags))
    return "the baseline", dict(baseline)


def _twin(previous, plan, params: dict, cal):
    """The twin's Prediction for `params` on `plan`'s workload, priced by `cal` (previous generation's fit)."""
    from optimizer.twin import envelope  # noqa: PLC0415
    from optimizer.twin.prediction import BAND, BAND_ONE_RUN, predict  # noqa: PLC0415
    from optimizer.twin.server import TwinServer  # noqa: PLC0415

    from optimizer.trial.rate_search import nominal_rate  # noqa: PLC0415

    server = TwinServer.from_flags(plan.model, plan.server_args(params), plan.device, "", cal.kv_calibration)
    sim = server.run(plan.workload.requests, plan.workload.concurrency, cal.cost)
    pred = predict(sim, plan.objective.slos)
    pred.bands = BAND_ONE_RUN if len(cal.runs) == 1 else BAND
    # the new traffic's rate against the calibration's: a deeper queue than it ever saw doubles the bands
    pred.outside = envelope.outside(server.shape, [s.shape for s in cal.servers], params,
                                    nominal_rate(plan.workload.requests), nominal_rate(previous.workload.requests),
                                    envelope.median_prompt(plan.workload.requests),
                                    envelope.median_prompt(previous.workload.requests),
                                    batch=sim.server["running_peak"], calibrated_batch=cal.largest_batch)
    return pred


def forecast(previous, plan, which: str, params: dict) -> Forecast:
    """`params` on `plan`'s workload by the twin calibrated on `previous` (the last generation's plan);
    raises where the twin cannot answer (the Forecaster says why and goes on)."""
    from optimizer.twin.from_study import calibrate  # noqa: PLC0415

    cal = calibrate(previous)
    pred = _twin(previous, plan, params, cal)
    metrics = {m: [_num(pred.metrics.get(m, math.nan)), *map(_num, pred.band(m))] for m in SHOWN}
    slos = [_judged(s, pred) for s in plan.objective.slos if s.metric != "error"]
    broken = [s for s in slos if not s["holds"]]
    verdict = "no SLOs" if not slos else "breaks" if broken else "holds"
    # outside the calibration the twin's error was never measured: its verdict is never sure
    sure = bool(slos) and not pred.outside and (any(s["sure"] for s in broken) if broken else all(s["sure"] for s in slos))
    trials = ", ".join(str(r.number) for r in cal.runs)
    return Forecast(which, params, f"study '{previous.cfg.study_name}', trial(s) {trials}", metrics, slos, verdict,
                    sure, list(pred.outside))


def _judged(slo: Slo, pred) -> dict:
    metric = f"{slo.metric}_ms_p{slo.percentile}"
    value = pred.metrics.get(metric, math.nan)
    low, high = pred.band(metric)
    holds = value <= slo.limit
    sure = high <= slo.limit if holds else low > slo.limit
    return {"slo": str(slo), "metric": metric, "limit": slo.limit, "predicted": _num(value), "low": _num(low),
            "high": _num(high), "holds": holds, "sure": sure}


def _num(x) -> float | None:
    """A figure for JSON (the study's record, /status): None where the twin has none."""
    return float(x) if x is not None and math.isfinite(x) else None


def ordered(previous, plan, warm: list[dict]) -> list[dict]:
    """The warm starts, best predicted first by the objective on the new workload (those the twin
    cannot predict keep their order, last); unchanged where the twin cannot be calibrated."""
    from optimizer.twin.from_study import calibrate  # noqa: PLC0415

    if len(warm) < 2:
        return list(warm)
    try:
        cal = calibrate(previous)
    except Exception:  # noqa: BLE001 - the order advises; a twin that fails must not stop the daemon
        return list(warm)
    base = baseline_params(plan)
    maximize = plan.objective.direction == "maximize"
    keyed = []
    for i, params in enumerate(warm):
        try:  # the knobs a trial of these warm-start values boots with: the baseline's outside the space too
            value = plan.objective.score(_twin(previous, plan, {**base, **params}, cal).metrics)
            rank = -value if maximize else value
        except Exception:  # noqa: BLE001
            rank = math.inf
        keyed.append((rank if math.isfinite(rank) else math.inf, i, params))
    return [params for _, _, params in sorted(keyed, key=lambda k: (k[0], k[1]))]


def _measured_trial(study, which: str, params: dict):
    if which != "the baseline" and not params:
        return None  # no flag to recognise it by
    for t in sorted(study.get_trials(deepcopy=False, states=(COMPLETE,)), key=lambda t: t.number):
        if of_trial.value_from_partial_run(t) or not of_trial.metrics(t):
            continue
        if which == "the baseline":
            if of_trial.is_baseline(t):
                return t
            continue
        knobs = knobs_of(t)
        if all(str(knobs.get(k)) == str(v) for k, v in params.items()):
            return t
    return None


def against_measured(record: dict, study) -> dict:
    """The stored forecast `record` with its measurement from `study` (the generation's own trials)
    added as `measured`: the trial, its latencies, its verdict, right or not, and |error| per metric
    (log scale, in %); `measured` is None while no trial booted that configuration fully."""
    t = _measured_trial(study, record["of"], record["params"])
    if t is None:
        return {**record, "measured": None}
    got = of_trial.metrics(t)
    errors = {}
    for m, (predicted, _, _) in record["metrics"].items():
        value = got.get(m)
        if value and predicted and value > 0 and predicted > 0:
            errors[m] = round(100 * abs(math.log(predicted / value)), 1)
    holds = [got.get(s["metric"]) is not None and got[s["metric"]] <= s["limit"] for s in record["slos"]]
    verdict = "no SLOs" if not holds else "holds" if all(holds) else "breaks"
    measured = {"trial": t.number, "metrics": {m: got.get(m) for m in record["metrics"]}, "verdict": verdict,
                "right": verdict == record["verdict"], "error_pct": errors}
    return {**record, "measured": measured}


class Forecaster:
    """The daemon's side: a forecast when a change starts a generation, said on the console and in
    `/status` (`forecast`), and its measurement once the generation has run."""

    def __init__(self, state, console):
        self.state, self.console = state, console
        self._earlier: list = []  # the plans of the generations before, oldest first (a few)

    def before(self, previous, plan, n: int) -> dict | None:
        """Generation n's forecast (its record), from the previous generation's plan, or, where that
        one finished no run (ended early for newer traffic), the latest that did; None where the twin
        cannot answer (said once, with why)."""
        which, params = current_params(self.state.snapshot().get("recommendation"), plan.cfg.baseline or {})
        f, why = None, ""
        earlier = [p for p in self._earlier if p is not previous]
        for source in [previous, *reversed(earlier)]:
            try:
                f = forecast(source, plan, which, params)
                break
            except Exception as exc:  # noqa: BLE001 - the forecast advises; a twin that fails must not stop the daemon
                why = why or first_line(exc, 200)
        self._earlier = [*earlier, previous][-EARLIER:]
        if f is None:
            self.console.print(f"  generation {n}: no forecast ({why})")
            self.state.set(forecast={"generation": n, "none": why})
            return None
        shown = " ".join(to_cli_args(params)) or "vLLM's defaults"
        self.console.print(f"  generation {n}: forecast for {which} ({shown}) on the new traffic, nothing booted: "
                           f"{f.describe()}")
        record = {**f.as_dict(), "generation": n}
        self.state.set(forecast=record)
        return record

    def after(self, study, n: int) -> None:
        """The generation's forecast against the trial that booted its configuration, stored and said."""
        from optimizer.record import of_generation  # noqa: PLC0415

        record = of_generation.forecast(study)
        if not record or record.get("measured"):
            return
        try:
            done = against_measured(record, study)
        except Exception as exc:  # noqa: BLE001 - a record it cannot read must not stop the daemon
            self.console.print(f"  generation {n}: the forecast not checked ({first_line(exc, 200)})")
            return
        m = done["measured"]
        if m is None:
            return
        of_generation.write_forecast(study, done)
        self.state.set(forecast=done)
        predicted, measured = record["metrics"][HEADLINE][0], m["metrics"].get(HEADLINE)
        error = m["error_pct"].get(HEADLINE)
        figures = (f"p95 TTFT predicted {predicted:.0f} ms, measured {measured:.0f} ms ({error:g}% off)"
                   if error is not None else "p95 TTFT not comparable")
        self.console.print(f"  generation {n}: forecast against trial {m['trial']}: {figures}; verdict {record['verdict']} "
                           f"predicted, {m['verdict']} measured ({'right' if m['right'] else 'wrong'})")
