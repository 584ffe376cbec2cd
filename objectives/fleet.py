"""The fleet (capacity planning): the fewest devices that carry a peak load under the SLOs.

Each trial measures one replica's goodput under the SLOs (the rate search of the goodput
objective) and is scored by the devices a fleet of such replicas needs for the peak:

    devices = devices per replica x ceil(peak / (goodput x (1 - headroom)))

where a replica's devices are its ranks (tensor x pipeline x data parallel sizes: GPUs on GPU,
core groups on CPU). Fewest first. Ties are broken by the tail: the score is the device count
plus t / (1 + t), t the replica's p95 TTFT in seconds at its goodput rate, a fraction that never
reaches the next whole device. A fleet over `budget` devices, or a replica that holds the SLOs
at no rate, is infeasible (the constraint `fleet_budget` > 0, which the sampler learns).

Without a peak, the score is goodput per device (req/s per device, maximized): what a device
earns in this topology.
"""

from __future__ import annotations

import math

from .base import Single, finite

NO_FLEET = 1e6  # the score of a replica that holds the SLOs at no rate: no fleet of it carries the peak


class FleetObjective(Single):
    name = "fleet"
    mode = "goodput"

    def __init__(self, metric: str | None = None, slos: tuple = (), fleet=None):
        if not slos:
            raise ValueError("fleet objective: needs SLOs, e.g. slos: 'ttft:500 tpot:50' (ms)")
        super().__init__(slos)
        self.peak = getattr(fleet, "peak_qps", None)
        self.headroom = getattr(fleet, "headroom", 0.2) if fleet is not None else 0.2
        self.budget = getattr(fleet, "budget", None)
        if self.peak is None:
            self.metric, self.direction, self.unit = "goodput_per_device", "maximize", "req/s per device"
        else:
            self.metric, self.direction, self.unit = "fleet_devices", "minimize", "devices"
        if metric not in (None, self.metric):
            raise ValueError(f"fleet objective: metric '{metric}' unknown; it reads {self.metric}")
        terms = [f"peak {self.peak:g} req/s, headroom {self.headroom:.0%}"] if self.peak is not None else []
        terms += [f"budget {self.budget}"] if self.budget else []
        self.terms = " " + ", ".join(terms) if terms else ""  # said in the study's stamp and the tables

    def replicas(self, rate: float) -> int | None:
        """Replicas the peak needs at `rate` req/s each (None: no rate held the SLOs, or no peak)."""
        if self.peak is None or not rate > 0:
            return None
        return max(1, math.ceil(self.peak / (rate * (1 - self.headroom)) - 1e-9))

    def devices(self, metrics: dict[str, float]) -> int | None:
        """Devices the fleet needs (None: no fleet of this replica carries the peak)."""
        count = self.replicas(metrics.get("goodput_rate") or 0.0)
        return None if count is None else count * int(metrics.get("devices") or 1)

    def score(self, metrics: dict[str, float]) -> float:
        rate = finite(metrics.get("goodput_rate"), "goodput_rate")
        per_replica = max(1, int(metrics.get("devices") or 1))
        if self.peak is None:
            return rate / per_replica
        devices = self.devices(metrics)
        if devices is None:
            return NO_FLEET
        tail = (metrics.get("ttft_ms_p95") or 0.0) / 1000
        return devices + (tail / (1 + tail) if math.isfinite(tail) else 0.99)

    def constraints(self, metrics: dict[str, float]) -> dict[str, float]:
        """`fleet_budget`: devices over the budget (<= 0 holds); a replica with no goodput violates it."""
        if self.budget is None or self.peak is None:
            return {}
        devices = self.devices(metrics)
        return {"fleet_budget": float(devices - self.budget) if devices is not None else NO_FLEET}
