"""What the daemon records on each generation's study: which generation it is and why it started,
the traffic it tunes on (its source, fingerprint and shape), what production showed in that window,
the warm starts and admission notes it began with, the forecast for production's configuration on
that traffic (and its measurement), an early end for new traffic, and the publish gate's decision.
"""

from __future__ import annotations

from optimizer.record._holder import get, has, put

GENERATION, TRIGGER, STARTED = "generation", "trigger", "generation_started"
TRAFFIC_SHAPE, TRAFFIC_SOURCE, TRAFFIC_FINGERPRINT = "traffic_shape", "traffic_source", "traffic_fingerprint"
PREVIOUS_STUDY, WARM_START, ADMISSION, PRODUCTION = "previous_study", "warm_start", "admission", "production"
ENDED_EARLY, PUBLISH, FORECAST = "ended_early", "publish", "forecast"


def has_generation(holder) -> bool:
    """The study was stamped as a generation (a resumed one keeps what it started with)."""
    return has(holder, GENERATION)


def write_generation(study, *, n: int, trigger: str, started: float, shape: dict, previous: str | None,  # noqa: PLR0913
                     warm: list, admission: list, source: str | None = None, fingerprint: str | None = None,
                     production: dict | None = None, forecast: dict | None = None) -> None:
    """Stamp a generation's study when it opens; the traffic's source and production only where known."""
    values = {GENERATION: n, TRIGGER: trigger, STARTED: started, TRAFFIC_SHAPE: shape, PREVIOUS_STUDY: previous,
              WARM_START: warm, ADMISSION: admission}
    if source is not None:
        values.update({TRAFFIC_SOURCE: source, TRAFFIC_FINGERPRINT: fingerprint})
    if production is not None:
        values[PRODUCTION] = production
    if forecast is not None:
        values[FORECAST] = forecast
    for key, value in values.items():
        put(study, key, value)


def started(holder, default: float) -> float:
    return get(holder, STARTED, default)


def traffic_shape(holder) -> dict | None:
    return get(holder, TRAFFIC_SHAPE)


def traffic_source(holder) -> str | None:
    return get(holder, TRAFFIC_SOURCE)


def traffic_fingerprint(holder) -> str | None:
    return get(holder, TRAFFIC_FINGERPRINT)


def production(holder) -> dict | None:
    """What production showed in the window tuned on: {"latencies", "requests", "rate", "flags", ...}."""
    return get(holder, PRODUCTION)


def write_ended_early(study, at: float, why: str, saturated: bool) -> None:
    put(study, ENDED_EARLY, {"at": at, "why": why, "saturated": saturated})


def publish_decision(holder) -> dict | None:
    """The publish gate's record: {"published", "code", "reason", "decided_at", "generation", ...}."""
    return get(holder, PUBLISH)


def write_publish_decision(study, record: dict) -> None:
    put(study, PUBLISH, record)


def forecast(holder) -> dict | None:
    """The daemon's forecast for production's configuration on this generation's traffic, with its
    measurement once a trial booted it (daemon/forecast.py)."""
    return get(holder, FORECAST)


def write_forecast(study, record: dict) -> None:
    put(study, FORECAST, record)
