"""A GPU step cost corrected by a study's own runs on that GPU.

When a study ran on the device a what-if asks about, its trials say how far the library's (or the
roofline's) step cost is from that GPU as the operator runs it: the driver version, the clocks, the
host that feeds it, the kernels of the installed vLLM. The correction is fitted on the stored runs
(the baseline, and one run of the other KV dtype where there is one) as the CPU calibration is
(twin/fit.py: simulated at the runs' real send times, solved on the measured TTFTs and first-to-last
token spans), with three coefficients:

    scale    the base step cost's seconds, times this
    step_s   per step, on top: host-side work a kernel timing does not hold (the engine loop,
             scheduling, output processing)
    intake   per request, replacing the base's: the front end as measured

so a step costs scale x base(step) + step_s. The base is priced per run, at the run's own TP and KV
dtype, so a correction found at TP 1 carries to a what-if at TP 2 on the same device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from optimizer.twin.step_cost import StepShape


@dataclass(frozen=True)
class Correction:
    scale: float
    step_s: float
    intake_s: float
    calibrated_on: tuple[str, ...] = field(default=(), compare=False)

    def describe(self) -> str:
        return (f"x {self.scale:.3g}, + {self.step_s * 1000:.3g} ms a step; intake {self.intake_s * 1000:.3g} ms "
                f"(fitted on {', '.join(self.calibrated_on)})")


@dataclass(frozen=True)
class CorrectedStepCost:
    base: object  # a StepCost: twin/gpu/library_cost.py's or twin/gpu/roofline_cost.py's
    correction: Correction

    @property
    def name(self) -> str:
        return f"{self.base.name}, corrected by the study's runs on it ({self.correction.describe()})"

    @property
    def intake_s(self) -> float:
        return self.correction.intake_s

    def seconds(self, shape: StepShape) -> float:
        base = self.base.seconds(shape)
        return self.correction.scale * base + (self.correction.step_s if base > 0 else 0.0)


class CorrectionTerms:
    """The fit's terms (twin/fit.py) for a correction: a step's row is (its base cost, 1)."""

    size = 2

    def row(self, run, shape: StepShape) -> np.ndarray:
        return np.array([run.base.seconds(shape), 1.0])

    def make(self, coef, intake: float, labels: tuple) -> Correction:
        return Correction(float(coef[0]), float(coef[1]), float(intake), tuple(labels))

    def unpack(self, fitted: Correction) -> tuple[np.ndarray, float]:
        return np.array([fitted.scale, fitted.step_s]), fitted.intake_s

    def cost_for(self, fitted: Correction, run) -> CorrectedStepCost:
        return CorrectedStepCost(run.base, fitted)

    def fill(self, coef, used) -> None:
        """Nothing to fill: a coefficient no row informed stays 0."""


TERMS = CorrectionTerms()
START = Correction(1.0, 0.0, 0.01)
