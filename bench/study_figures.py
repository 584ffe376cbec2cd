"""Figures of a finished study: per-trial phase times (median), the start-up's steps summed over the
trials (and the compile cache's hits and misses), baseline vs Optuna's best single run,
the recommendation (what the report deploys) with what mattered, failures.

Measures nothing itself: it reads what the trials measured and recorded in the study.
    python bench/study_figures.py [--storage sqlite:///trials.db] [--study-name quickstart]
"""

from __future__ import annotations

import argparse
from statistics import median

import optuna


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--storage", default="sqlite:///trials.db")
    ap.add_argument("--study-name", default="quickstart")
    ns = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=ns.study_name, storage=ns.storage)
    trials = [t for t in study.trials if t.state.is_finished()]
    print(f"study {study.study_name}: {len(trials)} finished trials "
          f"({sum(t.state.name == 'COMPLETE' for t in trials)} complete, "
          f"{sum(t.state.name == 'PRUNED' for t in trials)} pruned, {sum(t.state.name == 'FAIL' for t in trials)} fail)")
    wall = [(t.datetime_complete - t.datetime_start).total_seconds() for t in trials if t.datetime_complete]
    print(f"trial wall time: median {median(wall):.0f} s, total {sum(wall):.0f} s")
    for group, states in (("complete", ("COMPLETE",)), ("pruned", ("PRUNED",))):
        rows = [t.user_attrs.get("phases_s", {}) for t in trials if t.state.name in states]
        if not rows:
            continue
        keys = ("startup_s", "warmup_s", "replay_s", "shutdown_s")
        cells = ", ".join(f"{k.removesuffix('_s')} {median(r[k] for r in rows if k in r):.1f} s"
                          for k in keys if any(k in r for r in rows))
        print(f"median phases of {group} trials (n={len(rows)}): {cells}")
    from optimizer.report.startup import startup_text, startup_totals  # noqa: PLC0415

    boots = startup_totals(trials)
    print(startup_text(boots) if boots else "start-up steps: not recorded (a study run before the breakdown)")
    base = next((t for t in trials if t.user_attrs.get("baseline")), None)
    if base is not None and base.value is not None:
        best = study.best_trial
        ratio = best.value / base.value if study.direction.name == "MAXIMIZE" else base.value / best.value
        print(f"baseline trial {base.number}: {base.value:.1f}; best trial {best.number}: {best.value:.1f} "
              f"({ratio:.2f}x) params {best.params}")
        for t in (base, best):
            m = t.user_attrs.get("metrics", {})
            print(f"  trial {t.number}: out {m.get('output_throughput')} tok/s, p50/p95 TTFT "
                  f"{m.get('ttft_ms_p50')}/{m.get('ttft_ms_p95')} ms, p95 TPOT {m.get('tpot_ms_p95')} ms")
    _recommendation(study)
    for t in trials:
        if t.state.name != "COMPLETE":
            print(f"  trial {t.number} {t.state.name} {t.user_attrs.get('failure_kind')}: "
                  f"{str(t.user_attrs.get('evidence'))[:160]}")


def _recommendation(study) -> None:
    """What the study recommends (the report's answer), the minimal-change rows and what the step cost."""
    from optimizer.verdict.recommendation import recommend
    from optimizer.text.verdicts import attribution, gain_text

    rec = recommend(study)
    if rec is None:
        return
    print(f"recommended ({rec.source}, from trial {rec.trial.number}): {' '.join(rec.args)}; mean {rec.value:.1f} "
          f"over {len(rec.values)} run(s); gain {gain_text(rec.gain)}")
    for row in attribution(rec):
        print("  " + " | ".join(row))
    record = study.user_attrs.get("minimal") or {}
    if record.get("done"):
        print(f"  minimal-change step: {record.get('boots')} extra boot(s), {record.get('wall_s')} s")
    _boots(study, record)


def _boots(study, minimal: dict) -> None:
    """vLLM boots by kind: search trials (a repeat or a KV-precheck prune boots nothing), re-measurements
    (a configuration's runs past its trial's), the minimal-change step's own runs."""
    trials = [t for t in study.trials if t.state.is_finished()]
    search = sum(1 for t in trials if "phases_s" in t.user_attrs and "repeat_of" not in t.user_attrs)
    runs = (study.user_attrs.get("confirmation") or {}).get("runs") or {}
    remeasure = sum(len(e.get("values") or []) - 1 + int(e.get("failed") or 0) for e in runs.values())
    settled = sum(1 for e in runs.values() if e.get("settled"))
    own = sum(len(v) for v in (minimal.get("runs") or {}).values())
    print(f"boots: {search} search + {remeasure} re-measurement ({settled} configuration(s) not booted again: "
          f"already measurably worse) + {own} minimal-change = {search + remeasure + own}")


if __name__ == "__main__":
    main()
