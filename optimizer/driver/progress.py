"""What the user watches during a run: one line per trial event, phases as they change.

Plain lines (not a full-screen display) so the same output reads well in a terminal,
in `make run`'s log and in a Ray job's log.
"""

from __future__ import annotations

import os

import optuna
from rich.markup import escape
from rich.console import Console

from optimizer.driver.ray_runtime import unauthenticated_join
from optimizer.driver.store.database import masked
from optimizer.engine.device import GIB
from optimizer.measure.slo import describe as describe_slos
from optimizer.measure.interference import disturbance
from optimizer.measure.slo import holds as slo_holds
from optimizer.record import of_trial
from optimizer.text.knobs import fmt_params, shown
from optimizer.text.outputs import checked
from optimizer.text.verdicts import confirmation_lines, effect_text, screening_lines
from optimizer.verdict.trials import best_feasible, finished_count


def best_line(study: optuna.Study, objective) -> str | None:
    """'trial 3, 512.0 ms' for the best feasible trial; the front's size for a multi-objective study."""
    if getattr(objective, "multi", False):
        front = study.best_trials
        return f"{len(front)} trial(s) on the Pareto front" if front else None
    best = best_feasible(study, objective)
    if best is None:
        return None
    number = next(t.number for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                  if t.value == best)
    return f"trial {number}, {best:.1f} {objective.unit}"


class Progress:
    """The console's lines, and, given `dashboard` (report/dashboard_notes.py, or anything with its
    upload_trial_files and save_trial_note), each trial's files and note for optuna-dashboard."""

    def __init__(self, console: Console | None = None, dashboard=None):
        self.console = console or Console(highlight=False)
        self.dashboard = dashboard
        self._phase: dict[int, str] = {}
        self._best: str = "none yet"
        self.tagged = False  # several trials run at once: their phase and stage lines name the trial

    def _who(self, number: int) -> str:
        return f"trial {number} " if self.tagged else ""

    def slots(self, planned) -> None:
        """How many trials run at once (driver/resources.py), said when it is more than one or capped."""
        if planned.count > 1:
            asks = ", ".join(f"{k}={v:g}" for k, v in planned.request.items())
            self.console.print(f"  {planned.count} trials at once (each asks Ray for {asks})")
        if planned.warning:
            self.console.print(f"  [yellow]warning[/]: {planned.warning}")

    def opened(self, plan, study: optuna.Study, recovered: int) -> None:
        c, cfg = self.console, plan.cfg
        self._best = best_line(study, plan.objective) or "none yet"  # a daemon opens several studies
        done = finished_count(study)
        c.print(f"[bold]Study '{cfg.study_name}'[/] in {masked(plan.storage_url)}: {done} of {cfg.n_trials} trials done")
        c.print(f"  model {plan.model.source} ({plan.model.layers} layers, "
                f"{plan.model.kv_bytes_per_token() // 1024} KiB KV/token), device {plan.device.kind}"
                + (f", node memory {plan.device.memory.total / GIB:.1f} GiB "
                   f"({plan.device.memory.available / GIB:.1f} available)" if plan.device.kind == "cpu" else ""))
        obj = plan.objective
        c.print(f"  objective {obj.name}: {'/'.join(obj.directions)} {obj.metric} ({obj.unit})"
                + (f"; SLOs {describe_slos(obj.slos)}" + (" (constraints)" if obj.mode == "replay" else "")
                   if obj.slos else ""))
        c.print(f"  workload {plan.workload.description}; hash {plan.workload.content_hash()[:12]}")
        for note in plan.workload.notes:
            c.print(f"  [yellow]workload note[/]: {note}")
        for d in plan.space.dims:
            rng = f"{list(d.choices)}" if d.choices else f"[{d.low:g}, {d.high:g}]{' log' if d.log else ''}"
            c.print(f"  space {d.knob.name} {rng}")
        for note in plan.space.notes:
            c.print(f"  note: {note}")
        if (joining := unauthenticated_join(cfg.ray.address or os.environ.get("RAY_ADDRESS"))) is not None:
            c.print(f"  [yellow]warning[/]: {joining}")
        es, cf = cfg.early_stop, cfg.confirm
        c.print("  search: " + ("each knob moved alone from the baseline first, then TPE over the knobs that moved "
                                "the objective" if cfg.search.screen else "TPE over every knob")
                + ("; the twin predicts each proposed configuration first, and one it predicts to lose beyond its "
                   "band, or schedules as the baseline, is not booted" if cfg.search.prior == "twin" else ""))
        c.print(f"  KV precheck {'on' if cfg.precheck else 'off (--no-precheck)'}; early stop "
                + (f"after each of {es.stages} stages" if es.enabled else "off")
                + (f"; then the {cf.top} best and the baseline re-measured {cf.repeats}x" if cf.top and cf.repeats else "")
                + (f", and each changed knob put back (at most {cf.minimal_boots} boots)"
                   if cf.top and cf.repeats and cf.minimal else ""))
        if recovered:
            c.print(f"  recovered {recovered} trial(s) a previous run left RUNNING: marked FAIL and queued again")

    def recovery(self, rec) -> None:
        """What starting cleaned up after a driver that did not end cleanly (driver/store/driver_lock.py)."""
        if not rec:
            return
        d = rec.previous or {}
        who = f"pid {d.get('pid')} on {d.get('host')}" if d else "unknown"
        self.console.print(f"[yellow]recovered[/] after a driver that did not stop cleanly ({who}): "
                           f"{len(rec.servers_killed)} vLLM process group(s) and {rec.ray_killed} Ray process(es) "
                           "it left behind stopped")
        for note in rec.notes:
            self.console.print(f"  note: {note}")

    def waiting_disk(self, directory, why: str) -> None:
        self.console.print(f"[red]waiting for disk space[/]: {directory} does not take writes ({why}); "
                           "free space there (the next trial starts by itself) or stop with Ctrl-C")

    def disk_back(self, directory) -> None:
        self.console.print(f"  {directory} takes writes again: going on")

    def note(self, text: str | None) -> None:
        """A side effect that did not happen (a dashboard note or artifact); the study goes on."""
        if text:
            self.console.print(f"  [yellow]note[/]: {text}")

    def uploaded(self, trial, trial_dir, artifacts_dir) -> None:
        """The trial's files attached to it for optuna-dashboard (before it is told)."""
        if self.dashboard is not None:
            self.note(self.dashboard.upload_trial_files(trial, trial_dir, artifacts_dir))

    def noted(self, study: optuna.Study, number: int, objective) -> None:
        """The trial's optuna-dashboard note (after it is told, when its state is known)."""
        if self.dashboard is not None:
            self.note(self.dashboard.save_trial_note(study, number, objective.metric, objective.unit))

    def heartbeat(self) -> None:
        """The driver's loop is alive (the daemon's status API reads it)."""

    def trial_started(self, number: int, position: int, total: int, params: dict, baseline: bool,
                      screen: str | None = None) -> None:
        role = " baseline" if baseline else f" screening {screen}" if screen else ""
        self.console.print(f"[bold]trial {number}[/] ({position}/{total}){role}: {fmt_params(params)}")

    def predicted(self, number: int, predicted, band: float | None, unit: str, booted: bool = True) -> None:
        """What the twin predicted for a trial before it boots (search/prior.py), and how far it is trusted;
        `booted` False when it is told without a boot (the line after says why)."""
        trust = (f"its band +-{band:.0%}" if band is not None else "its band here not known yet: booted")
        where = (f"; outside its envelope ({'; '.join(predicted.outside)})" + (": booted" if booted else "")
                 if predicted.outside else "")
        self.console.print(f"  twin: trial {number} predicted at {predicted.value:.4g} {unit} ({trust}{where})")

    def screened(self, found: dict, baseline: dict) -> None:
        """What moving each knob alone did, and which knobs the sampler searches from now on."""
        self.console.print("[bold]Screening[/] (each knob moved alone from the baseline):")
        for line in screening_lines(found, baseline):
            self.console.print("  " + line)

    def repeated(self, study: optuna.Study, number: int, params: dict, source: int, state) -> None:
        """A trial that repeated a finished one's exact flags: told its outcome, not booted, not counted."""
        self.console.print(f"trial {number}: {fmt_params(params)}: the same flags as trial {source}, told its "
                           f"outcome ({state.name}) without a boot, not counted in n_trials")

    def phase(self, number: int, phase: str, elapsed: float) -> None:
        if self._phase.get(number) != phase:
            self._phase[number] = phase
            self.console.print(f"  {self._who(number)}{elapsed:5.0f}s  {phase}   (best so far: {self._best})")

    def confirming(self, top: int, repeats: int) -> None:
        self.console.print(f"[bold]Re-measuring[/] the {top} best configuration(s) and the baseline up to {repeats} "
                           "more time(s) each (full runs: single measurements move 10-15% on a busy machine; one "
                           "already measurably worse than the leader is not booted again)")

    def confirm_value(self, number: int, k: int, value: float | None) -> None:
        self._phase.pop(number, None)
        shown = f"{value:.2f}" if value is not None else "failed"
        self.console.print(f"  trial {number} re-measure {k}: {shown}")

    def confirm_settled(self, number: int, r: dict) -> None:
        self.console.print(f"  trial {number}: not booted again, already measurably worse than the leader "
                           f"({r['ratio']:.2f}x [{r['low']:.2f}, {r['high']:.2f}] of it)")

    def confirmed(self, record: dict, objective) -> None:
        for line in confirmation_lines(record, objective):
            self.console.print("  " + line)

    def minimizing(self, number: int, back: dict, cap: int) -> None:
        if back:
            self.console.print(f"[bold]Minimal change[/]: trial {number} changed {len(back)} knob(s) from the baseline; "
                               f"putting each back, one at a time (at most {cap} extra boots)")

    def reverted(self, row) -> None:
        r = row.as_dict()
        what = (f"{r['knob']} {shown(r['winner'])} -> {shown(r['reverted_to'])}" if r["baseline"] is not None
                or r["reverted_to"] is not None or r["winner"] is not None else f"{r['knob']} put back together")
        self.console.print(f"  {what}: {effect_text(r)}{' of the winner' if r['effect'] else ''}: [bold]{r['verdict']}[/]"
                           + (f" ({r['note']})" if r["note"] else ""))

    def minimized(self, record: dict, objective) -> None:
        if not record["rows"]:
            return  # the winner is the baseline's configuration: nothing to put back
        reverted = [r["knob"] for r in record["rows"] if r["verdict"] == "reverted"]
        undecided = [r["knob"] for r in record["rows"] if r["verdict"] == "undecided"]
        self.console.print(f"  recommended: {fmt_params(record['final']['knobs'])}"
                           + (f" (back at the baseline's: {', '.join(reverted)})" if reverted else "")
                           + (f" (undecided, kept at the winner's: {', '.join(undecided)})" if undecided else "")
                           + f"; {record['boots']} extra boot(s), {record['wall_s'] / 60:.1f} min")

    def checkpoint(self, number: int, step: int, value: float | None, objective, stop: str) -> None:
        if value is None and not stop:
            return  # no partial value (the fleet objective's devices need the whole rate search)
        shown = f"{value:.1f} {objective.unit}" if value is not None else "-"
        self.console.print(f"        {self._who(number)}stage {step}: {objective.metric} so far {shown}"
                           + (f" -> [yellow]stop[/]: {stop}" if stop else ""))

    def trial_done(self, study: optuna.Study, number: int, result, state, objective) -> None:
        ph = result.phases
        times = ", ".join(f"{k.removesuffix('_s')} {v:.0f}s" for k, v in ph.items())
        if state == optuna.trial.TrialState.COMPLETE:
            m = result.metrics
            trial = study.get_trials(deepcopy=False)[number]  # no copy of every trial per line
            told = trial.values
            value = told if len(told) > 1 else told[0]
            shown = " ".join(f"{v:.1f}" for v in value) if isinstance(value, list) else f"{value:.2f}"
            extra = ""
            if objective.mode == "goodput":
                extra = (f"capacity {m['capacity_rps']:.2f} req/s, {m['goodput_output_throughput']:.0f} tok/s at "
                         f"the goodput rate, {m['probes']:.0f} probes | ")
            if objective.name == "fleet":
                replicas = objective.replicas(m["goodput_rate"])
                extra = (f"goodput {m['goodput_rate']:.2f} req/s on {m['devices']:.0f} device(s)"
                         + (f", {replicas} replica(s) for the peak" if replicas else "") + f"; {extra}")
            feasible = ""
            if objective.slos and objective.mode == "replay":
                feasible = " [green](SLOs hold)[/]" if slo_holds(objective.slos, m) else " [red](SLOs missed)[/]"
            self.console.print(
                f"  {self._who(number)}[green]COMPLETE[/] {objective.metric}={shown} {objective.unit}{feasible} | {extra}"
                f"{m['output_throughput']:.0f} tok/s, p95 TTFT {m['ttft_ms_p95']:.0f} ms, "
                f"p95 TPOT {m['tpot_ms_p95']:.1f} ms, errors {m['error_rate']:.0%}{_speculation(result.server)} | {times}")
            if outputs := checked(of_trial.regression(trial)):
                self.console.print(f"    outputs: {outputs}")
            if why := disturbance(result.replay_cpu):
                self.console.print(f"    [yellow]disturbed[/]: {escape(why)}")
        else:
            f = result.failure
            self.console.print(f"  {self._who(number)}[yellow]{state.name}[/] {f.kind}: {f.evidence[:240]}")
            saved = result.early_stop.get("saved_s") if result.early_stop else None
            self.console.print(f"    remedy: {f.remedy} | {times}" + (f", ~{saved:.0f}s of replay saved" if saved else ""))
        self._best = best_line(study, objective) or self._best


def _speculation(server: dict) -> str:
    """', speculation accepted 87% (4.49 tokens/step), prefix-cache hits 40%' when the server drafted
    tokens in the replay (the prefix cache's hits beside it: speculation can lower them)."""
    acceptance = (server or {}).get("spec_acceptance")
    if acceptance is None:
        return ""
    length, hits = server.get("spec_mean_accepted_length"), server.get("prefix_cache_hit_rate")
    return (f", speculation accepted {acceptance:.0%}" + (f" ({length:.2f} tokens/step)" if length is not None else "")
            + (f", prefix-cache hits {hits:.0%}" if hits is not None else ""))
