"""How far the what-if estimate lands from published vLLM measurements it was never fitted on.

For every row of bench/data/published_vllm.csv that the roofline's efficiencies were not fitted
on (bench/whatif_fit.py fits on the rows aiconfigurator's authors measured), the estimate is run
for the row's model, device, TP and load, by:
  (a) this project's prediction: aiconfigurator-core where it has timings for the device and can
      build the model, else the fitted roofline (optimizer/whatif/predict.py);
  (b) aiconfigurator-core alone, where it answers;
  (c) a plain roofline as llm-optimizer computes it (100% of the datasheet's bandwidth and FLOPs,
      no overheads);
  (r) the fitted roofline alone, on every row.
It prints each row's errors, then the median and 90th percentile of |predicted / measured - 1|
per metric and predictor, on the rows each answered and on the rows all answered.

Then the calibrated transfer: for a model and load measured on two devices (the library's rows,
with the roofline refitted without that model's rows), the ratio measured / predicted on one device
corrects the prediction for the other (optimizer/whatif/calibration.py).

    .venv/bin/python bench/whatif_validation.py
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from whatif_fit import fit, fitting_rows  # noqa: E402
from whatif_rows import Case, cases  # noqa: E402

from optimizer.errors import ConfigError  # noqa: E402
from optimizer.whatif import calibration, library, roofline  # noqa: E402
from optimizer.whatif.predict import predict  # noqa: E402

METRICS = ("ttft_s", "tpot_s", "throughput")
SHORT = {"ttft_s": "TTFT", "tpot_s": "TPOT", "throughput": "tok/s"}


def _values(e: roofline.Estimate | None) -> dict | None:
    if e is None or not e.fits:
        return None
    return {"ttft_s": e.ttft_s, "tpot_s": e.tpot_s, "throughput": e.throughput}


def predictions(c: Case) -> dict:
    arch, device = c.arch(), c.spec()
    out = {"r": _values(roofline.estimate(arch, device, c.serving, c.load)),
           "c": _values(roofline.estimate(arch, device, c.serving, c.load, roofline.PLAIN))}
    lib = library.estimate(c.source, arch, device, c.serving, c.load)
    out["b"] = _values(lib) if isinstance(lib, roofline.Estimate) else None
    project = predict(c.source, arch, device, c.serving, c.load)
    out["a"] = _values(project.estimate)
    out["a_by"] = "library" if project.by.startswith(library.NAME) else "roofline"
    return out


def _err(pred: dict | None, measured: dict, metric: str) -> float | None:
    if pred is None or metric not in measured:
        return None
    return pred[metric] / measured[metric] - 1


def _cell(e: float | None) -> str:
    """The error as a percentage, or past +1000% as the factor predicted / measured."""
    return "     -" if e is None else f"{e:+6.0%}" if abs(e) < 10 else f"{1 + e:5.1f}x"


def _summary(errs: list[float]) -> str:
    """Median and 90th percentile of |log(predicted / measured)|, shown as e^x - 1 (the factor's
    excess: +-100% is a factor of 2 either way); then the rows."""
    if not errs:
        return "        -"
    a = sorted(abs(math.log(1 + e)) for e in errs)
    p90 = a[min(len(a) - 1, math.ceil(0.9 * len(a)) - 1)]
    return f"{math.exp(statistics.median(a)) - 1:4.0%}/{math.exp(p90) - 1:4.0%} n{len(a)}"


def validation() -> dict:
    rows = [c for c in cases() if not c.library_rows and not c.skip]
    print(f"Validation rows (never fitted on): {len(rows)} of {len(cases())}; skipped: "
          + "; ".join(f"row {c.index} ({c.skip})" for c in cases() if c.skip))
    print(f"{'row':<58} {'by':<8} " + "  ".join(f"{SHORT[m]:>5} a/b/c/r" + " " * 12 for m in METRICS))
    errors = defaultdict(list)  # (predictor, metric) -> errors
    common = defaultdict(list)
    for c in rows:
        try:
            p = predictions(c)
        except ConfigError as exc:
            print(f"{c.label:<58} refused: {exc}")
            continue
        cells = []
        for m in METRICS:
            es = {k: _err(p[k], c.measured, m) for k in "abcr"}
            cells.append(" ".join(_cell(es[k]) for k in "abcr"))
            for k, e in es.items():
                if e is not None:
                    errors[(k, m)].append(e)
            if all(es[k] is not None for k in "abc"):
                for k in "abc":
                    common[(k, m)].append(es[k])
        print(f"{c.label:<58} {p['a_by']:<8} " + "  ".join(cells))
    print("\nError as a factor, e^|log(predicted / measured)| - 1: median/90th percentile, rows")
    print(f"{'predictor':<46}" + "".join(f"{SHORT[m]:>16}" for m in METRICS))
    names = {"a": "(a) this project (library, else fitted roofline)", "b": "(b) aiconfigurator-core alone",
             "c": "(c) plain roofline (llm-optimizer's)", "r": "(r) fitted roofline alone"}
    for k in "abcr":
        print(f"{names[k]:<46}" + "".join(f"{_summary(errors[(k, m)]):>16}" for m in METRICS))
    print("on the rows (a), (b) and (c) all answered:")
    for k in "abc":
        print(f"{names[k]:<46}" + "".join(f"{_summary(common[(k, m)]):>16}" for m in METRICS))
    return errors


def transfer() -> None:
    """Calibrate on one device's row, predict another's (same model and load shape)."""
    groups = defaultdict(list)
    for c in cases():
        if c.library_rows and not c.skip:
            groups[(c.model, c.load.isl, c.load.osl)].append(c)
    print("\nCalibrated transfer (roofline refitted without the model; measured/predicted on one row "
          "corrects the other):")
    errs = {"raw": defaultdict(list), "calibrated": defaultdict(list)}
    for (model, isl, osl), rows in groups.items():
        devices_ = {c.device for c in rows}
        if len(devices_) < 2:
            continue
        eff, _ = fit(fitting_rows(leave_out=model))
        est = {c.index: _values(roofline.estimate(c.arch(), c.spec(), c.serving, c.load, eff)) for c in rows}
        for src in rows:
            for dst in rows:
                if src.device == dst.device or not est[src.index] or not est[dst.index]:
                    continue
                cal = calibration.fit([(src.measured, est[src.index])])
                for m in ("ttft_s", "tpot_s"):
                    raw = est[dst.index][m] / dst.measured[m] - 1
                    errs["raw"][m].append(raw)
                    errs["calibrated"][m].append(cal.apply(m, est[dst.index][m]) / dst.measured[m] - 1)
        print(f"  {model} {isl}/{osl}: rows {', '.join(str(c.index) for c in rows)} "
              f"({', '.join(sorted(devices_))}), efficiencies refitted without it: bandwidth {eff.bandwidth:.2f}, "
              f"compute {eff.compute:.2f}")
    for kind in ("raw", "calibrated"):
        print(f"  {kind:<11}" + "".join(f"{SHORT[m]:>6} {_summary(errs[kind][m]):>16}" for m in ("ttft_s", "tpot_s")))


if __name__ == "__main__":
    validation()
    transfer()
