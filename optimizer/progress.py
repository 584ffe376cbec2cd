"""What the user watches during a run: one line per trial event, phases as they change.

Plain lines (not a full-screen display) so the same output reads well in a terminal,
in `make run`'s log and in a Ray job's log.
"""

from __future__ import annotations

import optuna
from rich.console import Console

from .device import GIB
from .outcome import finished_count


def fmt_params(params: dict) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()) or "(vLLM defaults)"


class Progress:
    def __init__(self, console: Console | None = None):
        self.console = console or Console(highlight=False)
        self._phase: dict[int, str] = {}
        self._best: str = "none yet"

    def opened(self, plan, study: optuna.Study, recovered: int) -> None:
        c, cfg = self.console, plan.cfg
        done = finished_count(study)
        c.print(f"[bold]Study '{cfg.study_name}'[/] in {plan.storage_url}: {done} of {cfg.n_trials} trials done")
        c.print(f"  model {plan.model.source} ({plan.model.layers} layers, "
                f"{plan.model.kv_bytes_per_token() // 1024} KiB KV/token), device {plan.device.kind}"
                + (f", node memory {plan.device.memory.total / GIB:.1f} GiB "
                   f"({plan.device.memory.available / GIB:.1f} available)" if plan.device.kind == "cpu" else ""))
        c.print(f"  objective {plan.objective.name}: {plan.objective.direction} {plan.objective.metric} "
                f"({plan.objective.unit})")
        c.print(f"  workload {plan.workload.description}; hash {plan.workload.content_hash()[:12]}")
        for note in plan.workload.notes:
            c.print(f"  [yellow]workload note[/]: {note}")
        for d in plan.space.dims:
            rng = f"{list(d.choices)}" if d.choices else f"[{d.low:g}, {d.high:g}]{' log' if d.log else ''}"
            c.print(f"  space {d.knob.name} {rng}")
        for note in plan.space.notes:
            c.print(f"  note: {note}")
        if recovered:
            c.print(f"  recovered {recovered} trial(s) a previous run left RUNNING: marked FAIL and queued again")

    def trial_started(self, number: int, position: int, total: int, params: dict, baseline: bool) -> None:
        role = " baseline" if baseline else ""
        self.console.print(f"[bold]trial {number}[/] ({position}/{total}){role}: {fmt_params(params)}")

    def phase(self, number: int, phase: str, elapsed: float) -> None:
        if self._phase.get(number) != phase:
            self._phase[number] = phase
            self.console.print(f"  {elapsed:5.0f}s  {phase}   (best so far: {self._best})")

    def trial_done(self, study: optuna.Study, number: int, result, state, objective) -> None:
        ph = result.phases
        times = ", ".join(f"{k.removesuffix('_s')} {v:.0f}s" for k, v in ph.items())
        if state == optuna.trial.TrialState.COMPLETE:
            m = result.metrics
            value = objective.score(m)
            self.console.print(
                f"  [green]COMPLETE[/] {objective.metric}={value:.1f} {objective.unit} | "
                f"{m['output_throughput']:.0f} tok/s, p95 TTFT {m['ttft_ms_p95']:.0f} ms, "
                f"p95 TPOT {m['tpot_ms_p95']:.1f} ms, errors {m['error_rate']:.0%} | {times}")
        else:
            f = result.failure
            self.console.print(f"  [yellow]{state.name}[/] {f.kind}: {f.evidence[:240]}")
            self.console.print(f"    remedy: {f.remedy} | {times}")
        try:
            best = study.best_trial
            self._best = f"trial {best.number}, {best.value:.1f} {objective.unit}"
        except ValueError:
            pass
