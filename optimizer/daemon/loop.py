"""`python -m optimizer daemon`: tune, then keep watching the traffic and tune again when it changes.

    generation 1   the config's study, resumed if it exists (its budget, then its report)
    watching       every `daemon.poll_s`, the newest trace in `daemon.watch`, or the live servers'
                   traffic over the last `window_s` (daemon/observing.py); when its shape (length
                   quantiles, rate, burstiness, prefix-cache hit rate, requests in flight:
                   workload/drift.py) moves beyond `daemon.threshold`, or `daemon.retune_every_h`
                   has passed since the last start,
    generation N   a new study `<study>-g<N>` on the new traffic, warm-started with the previous
                   generation's best in the twin's predicted order, after a forecast: does
                   production's configuration hold the SLOs on it (daemon/forecast.py)? Old studies are kept

With live servers, generation 1 waits ("observing") for a complete window with enough traffic.
After each generation its recommendation is published if it clears the gate (daemon/publish.py).

Each generation records on its study why it started (`trigger`), the trace it replays and its shape, and
what it was warm-started from. A restart resumes the latest generation. The status API (daemon/status_api.py)
serves what the daemon does; a stop signal ends the running trial as FAIL (`interrupted`, queued again), exit 0.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from optimizer import shutdown
from optimizer.config import space as space_mod
from optimizer.config.daemon_spec import LiveWatch
from optimizer.config.schema import StudyConfig
from optimizer.config.workload_spec import ChatSpec
from optimizer.daemon.generation_watch import GenerationWatch
from optimizer.daemon import admission
from optimizer.daemon.forecast import Forecaster, ordered
from optimizer.daemon.generations import generation_name, latest_generation, production_of, with_source
from optimizer.daemon.observing import Observer, admitted, episode, rejected_past
from optimizer.daemon.publisher import Publisher
from optimizer.daemon.status_api import StatusServer, StatusState
from optimizer.daemon.status_feed import StatusProgress
from optimizer.daemon.warm_start import fitting, warm_starts
from optimizer.driver.plan import Plan, load_workload, open_study, prepare, trials_at_once
from optimizer.driver.store import storage_loss
from optimizer.driver.store.database import masked, normalize_url, sqlite_path, study_attrs
from optimizer.driver.store.driver_lock import RunState
from optimizer.driver.study import run
from optimizer.errors import ConfigError, OptimizerError, first_line
from optimizer.measure.slo import parse_slos
from optimizer.record import of_generation, of_study
from optimizer.traffic.prometheus import PrometheusSource
from optimizer.verdict.trials import finished_count
from optimizer.traffic import window as window_mod
from optimizer.workload import drift
from optimizer.workload.materialize import read_workload

class Daemon:
    def __init__(self, cfg: StudyConfig, console: Console, host: str, port: int, token: str | None,
                 dashboard=None, report=None):
        """`dashboard` writes each trial's optuna-dashboard files and note (report/dashboard_notes.py) and
        `report(study, model, artifacts, objective, console)` prints a generation's report
        (report/console.py's print_report); the command passes both, the daemon imports neither."""
        self.cfg = cfg
        self.dashboard, self.report = dashboard, report
        self.d = cfg.daemon
        self.console = console
        self.live = self.d.watch if isinstance(self.d.watch, LiveWatch) else None
        if self.d.watch and self.live is None and cfg.workload.scenario != "trace":
            raise ConfigError(f"daemon.watch: watching '{self.d.watch}' needs workload scenario 'trace' "
                              f"(this workload is '{cfg.workload.scenario}'); set workload.scenario: trace")
        self.state = StatusState(stale_after_s=max(300.0, 3 * self.d.poll_s))
        self.state.set(state="starting")
        self.server = StatusServer(self.state, host, port, token)  # refuses a public bind without a token
        self.url = normalize_url(cfg.storage)
        self.publisher = Publisher(self.d.publish, self.state, console,
                                   Path(cfg.artifacts_dir) / "webhook-outbox" / cfg.study_name)
        self.observer = (Observer(self.live, self.d.poll_s, Path(cfg.artifacts_dir) / "traffic", self.state, console,
                                  on_saturated=self._saturated, slos=parse_slos(cfg.objective.slos),
                                  on_rejecting=self._rejecting, admits=admitted(cfg, self.live))
                         if self.live else None)
        self._pending: float | None = None  # when a change was seen during the last generation
        self._generation_no = 1
        self._seen: str | None = None  # the fingerprint of the last trace read
        self._admission: list[str] = []  # what the last plan changed to admit production's lengths
        self.forecaster = Forecaster(self.state, console)

    # --- one generation ------------------------------------------------------------------------
    def _source(self) -> Path | None:
        if not self.d.watch or self.live:
            return None
        src = drift.current_source(self.d.watch, self.d.settle_s)
        if src is None:
            raise ConfigError(f"daemon.watch: {self.d.watch} holds no settled trace file yet "
                              f"({', '.join(drift.TRACE_SUFFIXES)}); put one there first")
        return src

    def _plan(self, n: int, source: Path | None, warm: list[dict], previous: Plan | None = None) -> tuple[Plan, list[str]]:
        """Generation n's plan on `source`, fitted to what production admits (daemon/admission.py), its
        warm starts in the order the twin predicts (calibrated on `previous`, the last generation)."""
        admits = self.observer.admits if self.observer is not None else None
        cfg = with_source(self.cfg, source, admits).model_copy(update={"study_name": generation_name(self.cfg.study_name, n)})
        cfg, notes = admission.admitting(cfg, admits)
        plan = prepare(cfg)
        if admits and self._rejected_past(source, admits):
            cfg, wider = admission.admitting(cfg, admits, admission.widened(admits, plan.model.max_positions))
            plan, notes = (prepare(cfg), notes + wider) if wider else (plan, notes)
        for note in notes:
            self.console.print(f"  generation {n}: {note}")
        self._admission = notes
        if not warm:
            return plan, []
        kept, dropped = fitting(warm, plan)
        cfg = cfg.model_copy(update={"enqueue": (ordered(previous, plan, kept) if previous else kept) + list(cfg.enqueue)})
        return prepare(cfg), dropped

    def _rejected_past(self, source: Path | None, admits: int) -> bool:
        """The live window `source` had rejections that look like prompts past what production admits."""
        if self.live is None or source is None:
            return False
        try:
            return rejected_past(window_mod.read(source), admits)
        except ConfigError:
            return False

    def _as_stamped(self, plan: Plan, attrs: dict) -> Plan:
        """A resumed generation replays the workload it was stamped with, not its trace as it is now
        (a trace appended to since is the same traffic: `_watch` decides that, not a refusal)."""
        stored = of_study.workload_file(attrs)
        if not stored or not Path(stored).exists() or of_study.workload_hash(attrs) == plan.workload.content_hash():
            return plan
        workload = read_workload(stored)
        space = space_mod.resolve(plan.cfg, plan.device, plan.model, workload.longest_request(), trials_at_once(plan.cfg))
        return replace(plan, workload=workload, space=space)

    def _stamp(self, n, trigger: str, source: Path | None, previous: str | None, warm: list, plan: Plan, forecast=None):
        window = window_mod.read(source) if self.live and source is not None else None
        shape = drift.shape_of_window(window) if window is not None else drift.shape_of(plan.workload)
        admitted_notes = list(self._admission)

        def on_open(study) -> None:
            if of_generation.has_generation(study):
                return  # resumed: it keeps what it started with
            of_generation.write_generation(
                study, n=n, trigger=trigger, started=time.time(), shape=shape.to_dict(), previous=previous, warm=warm,
                admission=admitted_notes, source=str(source) if source is not None else None,
                fingerprint=drift.fingerprint(source) if source is not None else None,
                production=production_of(window) if window is not None else None, forecast=forecast)
        return on_open

    # --- the loop ------------------------------------------------------------------------------
    def run(self) -> int:
        if self.observer is not None:
            self.observer.check()  # an unreachable or wrong URL is refused at start (exit 2)
        newest = self._source()
        plan = prepare(self._checkable(newest))  # bad input is refused before the storage is read
        n, attrs = latest_generation(self.url, self.cfg.study_name) if self._storage_exists() else (1, {})
        if self._storage_exists():
            self.publisher.restore(study_attrs(self.url), self.cfg.study_name)
        source = Path(of_generation.traffic_source(attrs)) if of_generation.traffic_source(attrs) else newest
        if source is not None and not source.exists():
            raise ConfigError(f"daemon: the trace {source} of study '{generation_name(self.cfg.study_name, n)}' "
                              "is gone; put it back, or pass --study-name NEW to start over")
        self.server.start()  # a port in use is refused here (exit 2), before the run-state is taken
        self.console.print(f"status API on {self.server.url} (/healthz, /status, /recommendation, /metrics)")
        self.publisher.resend()
        if self.observer is not None and source is None:
            try:
                source = self.observer.first()
            except KeyboardInterrupt:
                self.server.stop()
                self.console.print("stopped while observing the traffic; nothing was tuned")
                return 0
        if n > 1 or source != newest:  # a later generation, or another trace: its own plan
            plan, _ = self._plan(n, source, [])
        plan = self._as_stamped(plan, attrs)
        trigger, previous, warm, forecast = "start", None, [], None
        try:
            with RunState(plan.storage_url, self.cfg.artifacts_dir, self.cfg.study_name) as runstate:
                progress = StatusProgress(self.console, self.state, n, self.dashboard)
                progress.recovery(runstate.acquire())
                while True:
                    if self.observer is not None:
                        self.observer.tuning()
                    on_open = self._stamp(n, trigger, source, previous, warm, plan, forecast)
                    study, plan, handed = storage_loss.retrying(
                        lambda: self._generation(plan, progress, runstate, n, source, on_open),
                        lambda why, wait: self._storage_lost(runstate, n, why, wait), runstate.relock)
                    if not handed:
                        self._report(study, plan)
                        self.publisher.publish(study, plan.cfg, plan.model.source, n)
                    self.forecaster.after(study, n)
                    self._seen = of_generation.traffic_fingerprint(study)
                    trigger, new_source, warm, next_plan, dropped = self._next_plan(study, plan, source, n)
                    forecast = self.forecaster.before(plan, next_plan, n + 1)
                    plan, source, previous, n = next_plan, new_source, study.study_name, n + 1
                    warm = [p for i, p in enumerate(plan.cfg.enqueue) if p in warm and p not in plan.cfg.enqueue[:i]]
                    self.console.print(f"[bold]generation {n}[/]: {trigger}; study '{plan.cfg.study_name}', "
                                       f"{len(warm)} warm start(s) from '{previous}'")
                    for why in dropped:
                        self.console.print(f"  warm start dropped: {why}")
                    progress.generation = n
                    if self.observer is None:  # a live watch keeps its own (the observer's) in /status
                        self.state.set(watch={"source": str(source) if source else None, "last_check": time.time(),
                                              "last_change": trigger})
        except KeyboardInterrupt:
            self.state.set(state="stopping", running=None)
            self.console.print("stopped: the running trial (if any) was told FAIL (interrupted) and queued again; "
                               "start the daemon again to resume")
            return 0
        finally:
            self.server.stop()

    def _storage_lost(self, runstate, n: int, why: str, wait_s: float) -> None:
        """The storage went away during generation n: said, and the running trial's evidence set."""
        runstate.previous = {"storage_lost": why}  # the trial left RUNNING is told why when it resumes
        self.state.set(state="waiting for the storage", running=None,
                       last_error=f"storage {masked(self.url)}: {why}")
        self.console.print(f"[red]storage lost[/] during generation {n} ({why}); trying again in {wait_s:.0f} s: "
                           "its finished trials are stored, the running one is queued again")

    def _next_plan(self, study, plan: Plan, source: Path | None, n: int):
        """Watch until a change is seen whose plan is valid: (trigger, its source, warm starts, the plan,
        the warm starts dropped). A plan refused (the new traffic's prompts exceed the model, the
        database is briefly down...) is said once per reason, and kept in /status' last_error."""
        refused = None
        while True:
            new_source = None
            try:
                trigger, new_source = self._watch(study, plan, source)
                warm = warm_starts(study, self.d.warm_start)
                next_plan, dropped = self._plan(n + 1, new_source, warm, plan)
                return trigger, new_source, warm, next_plan, dropped
            except (OptimizerError, *storage_loss.LOST) as exc:
                why = first_line(exc, 300)
                self.state.set(last_error=why)
                if why != refused:
                    self.console.print(f"[red]not re-tuning[/] on {new_source or 'the traffic'}: {why} (said once; "
                                       "/status last_error holds it while it lasts)")
                refused = why
                if isinstance(exc, storage_loss.LOST):
                    shutdown.sleep(self.d.poll_s)  # the storage: the watch reads it again at the next poll

    def _generation(self, plan: Plan, progress, runstate, n: int, source: Path | None, on_open):
        """Run generation n, its live source watched throughout (daemon/generation_watch.py); returns
        (study, plan, ended early for new traffic). A generation ended early keeps its finished trials
        and is neither reported nor published."""
        watch = self._generation_watch(n, source)
        self._pending = None
        try:
            with watch or nullcontext():
                return (*run(plan, progress, runstate, on_open), False)
        except shutdown.Handoff:
            study, plan = open_study(plan)
            of_generation.write_ended_early(study, time.time(), "; ".join(watch.moved), watch.saturated)
            self.console.print(f"generation {n} ended early for the new traffic: its {finished_count(study)} finished "
                               "trial(s) are kept, the running one was stopped and queued again")
            return study, plan, True
        finally:  # an aborted generation's change counts from its first sight; after `wait`, the
            if watch is not None and watch.aborted and watch.seen is not None:  # traffic is read afresh
                self._pending = watch.seen

    def _generation_watch(self, n: int, source: Path | None) -> GenerationWatch | None:
        if self.observer is None or source is None:
            return None
        try:
            window = window_mod.read(source)
        except ConfigError:
            return None
        self._generation_no = n
        return GenerationWatch(self.observer, drift.shape_of_window(window), self.d.threshold, self.d.poll_s,
                               self.d.on_change, self.console, n, tuned_saturated=window.saturated)

    def _saturated(self, window) -> None:
        """A saturated episode began: the webhook hears of it (when one is configured)."""
        self.publisher.event(episode("saturated", *self._episode_of(), window, saturation=window.saturation()))

    def _rejecting(self, window) -> None:
        """A rejecting episode began (requests answered 4xx/5xx): the webhook hears of it."""
        self.publisher.event(episode("rejecting", *self._episode_of(), window,
                                     rejected_4xx=round(window.rejected_4xx, 1),
                                     rejected_5xx=round(window.rejected_5xx, 1),
                                     rejected_share=round(window.rejected_share, 4)))

    def _episode_of(self) -> tuple:
        """(study, generation, source) an episode's webhook body names."""
        return self.cfg.study_name, self._generation_no, self.observer.source.describe() if self.observer else None

    def _checkable(self, newest: Path | None) -> StudyConfig:
        """The config checked at start. Watching live servers, no window exists yet: the workload is
        built from the first one, so a stand-in (the chat mix) checks the rest of the config."""
        if self.live is None:
            return with_source(self.cfg, newest)
        if "workload" in self.cfg.model_fields_set and self.cfg.workload.scenario != "observed":
            self.console.print(f"workload: built from the live traffic (daemon.watch); the config's "
                               f"'{self.cfg.workload.scenario}' workload is not used")
        return self.cfg.model_copy(update={"workload": ChatSpec(seed=self.cfg.workload.seed)})

    def _storage_exists(self) -> bool:
        path = sqlite_path(self.url)
        return path is None or path.exists()

    def _report(self, study, plan: Plan) -> None:
        if self.report is None:
            return
        try:
            self.report(study, plan.model.source, plan.artifacts, plan.objective, self.console)
        except OSError as exc:  # best.yaml on a full disk: the study is fine, the file is not written
            self.console.print(f"[red]report not written[/]: {exc.strerror or exc} in {plan.artifacts}")

    def _watch(self, study, plan: Plan, source: Path | None) -> tuple[str, Path | None]:
        """Wait until the traffic changes or the schedule says so; returns (trigger, the trace to tune on)."""
        stored = of_generation.traffic_shape(study)
        shape = drift.Shape.from_dict(stored) if stored is not None else drift.shape_of(plan.workload)
        started = of_generation.started(study, time.time())
        if self.observer is not None:
            return self._watch_live(shape, started, source, self._pending)
        watch = {"source": str(source) if source else None, "last_check": None, "last_change": None}
        self.state.set(state="watching", running=None, watch=watch)
        self.console.print(f"watching {self.d.watch or '(nothing: schedule only)'} every {self.d.poll_s:g}s; "
                           f"traffic now: {shape.describe()}")
        while True:
            shutdown.sleep(self.d.poll_s)
            now = time.time()
            if self.d.retune_every_h and now - started >= self.d.retune_every_h * 3600:
                return f"scheduled re-tune (every {self.d.retune_every_h:g} h)", (self._newest() or source)
            watch["last_check"] = now
            newest = self._newest()
            try:
                seen = drift.fingerprint(newest) if newest is not None else self._seen
            except OSError:  # rotated away between listing and reading: next poll
                continue
            if seen != self._seen:
                self._seen = seen
                try:
                    _, workload = load_workload(with_source(self.cfg, newest))
                except ConfigError as exc:  # a bad trace is reported and skipped; the daemon keeps watching
                    self.state.set(last_error=f"{newest}: {exc}")
                    self.console.print(f"[red]skipped[/] {newest}: {exc}")
                    continue
                moved = drift.changes(shape, drift.shape_of(workload), self.d.threshold)
                if moved:
                    return f"traffic changed in {newest.name}: {'; '.join(moved)}", newest
                watch["last_change"] = None
                self.console.print(f"  {newest.name}: same traffic (within {self.d.threshold:.0%})")
            self.state.set(watch=watch)

    def _watch_live(self, shape: drift.Shape, started: float, source: Path | None,
                    seen: float | None = None) -> tuple[str, Path | None]:
        """Compare each complete window with the generation's; a change is tuned on only once a
        whole window of the new traffic has been read (the window that shows a change first is
        mostly the old traffic), and only if that window still differs. `seen`: a change was
        first seen then, while the generation ran (its reads are kept: they count)."""
        obs = self.observer
        self.state.set(state="watching", running=None, watch=obs.watch)
        self.console.print(f"watching {obs.source.describe()} every {self.d.poll_s:g}s; traffic now: {shape.describe()}")
        said = False
        if seen is None:
            obs.restart()  # the window compared is the traffic from now on
        elif isinstance(obs.source, PrometheusSource):
            obs.not_before = seen + self.live.window_s
        while True:
            shutdown.sleep(self.d.poll_s)
            scheduled = self.d.retune_every_h and time.time() - started >= self.d.retune_every_h * 3600
            w = obs.current()
            if scheduled:
                return f"scheduled re-tune (every {self.d.retune_every_h:g} h)", (obs.save(w) if w else None) or source
            if w is None:
                said = False
                continue
            if (breach := obs.breach_due(self.d.slo_breach_s, w.end)) and (path := obs.save(w)) is not None:
                return breach, path
            moved = drift.changes(shape, drift.shape_of_window(w), self.d.threshold)
            if moved and seen is None:  # first sight: read a whole window of the new traffic
                seen = time.time()
                obs.watch["last_change"] = seen
                self.console.print(f"  traffic changed ({'; '.join(moved)}); reading a whole window of it "
                                   f"({self.live.window_s:g} s) before tuning")
                obs.restart(wait_s=self.live.window_s)
                continue
            if moved:  # a whole window of the new traffic (a file that cannot be written: next poll)
                if w.start >= seen - self.d.poll_s and (path := obs.save(w)) is not None:
                    return f"traffic changed on {obs.source.describe()}: {'; '.join(moved)}", path
                continue
            if seen is not None:
                self.console.print("  the change did not last: same traffic over the whole window")
                seen = None
            if not said:
                self.console.print(f"  same traffic (within {self.d.threshold:.0%}): {w.describe()}")
                said = True
            obs.watch["last_change"] = None

    def _newest(self) -> Path | None:
        if not self.d.watch:
            return None
        try:
            return drift.current_source(self.d.watch, self.d.settle_s)
        except ConfigError as exc:  # the watched path went away: report, keep waiting for it
            self.state.set(last_error=str(exc))
            return None
