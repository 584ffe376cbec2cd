"""The config's `daemon:` section: what the daemon watches (a trace path, or live servers:
`LiveWatch`), how it decides to tune again, and where a recommendation is published."""

from __future__ import annotations

import re
from typing import Annotated, Literal, Union

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from optimizer.config.base import Strict as _Strict


class LiveWatch(_Strict):
    """Traffic read from live vLLM servers: their own /metrics pages, or a Prometheus server that
    scrapes them (traffic/). The daemon only reads; it never sends a request to a watched server."""

    vllm_metrics: list[str] | None = Field(None, min_length=1, description="vLLM /metrics URLs, read every poll_s")
    prometheus: str | None = Field(None, description="a Prometheus server's base URL, e.g. http://prometheus:9090")
    selector: str = Field("", description="prometheus: the label selector of the vLLM series, "
                          "e.g. '{job=\"vllm\", model_name=\"llama\"}'")
    window_s: float = Field(600, ge=10, description="the traffic is the last this many seconds")
    sub_windows: int = Field(20, ge=4, le=200, description="prometheus: the window is cut in this many "
                             "steps for burstiness (vllm_metrics: one step per poll)")
    min_requests: int = Field(300, ge=1, description="a window with fewer finished requests is too little "
                              "traffic to tune on or compare: reported and skipped (the rate of n requests "
                              "varies by about 1/sqrt(n): 300 keeps two windows' rates within 25% at 3 sigma)")
    requests: int = Field(200, ge=1, description="requests in the synthesized workload (at the observed rate)")
    max_model_len: int | None = Field(None, ge=2, description="the longest request (prompt + output tokens) the "
                                      "watched servers admit, their --max-model-len; left out, what their "
                                      "/v1/models lists (vllm_metrics), else the baseline's max-model-len. The observed lengths are "
                                      "cut to it (production cannot have served a longer request: it answers 400), and to "
                                      "a --max-model-len engine.extra_args pins for the trials where shorter")

    @model_validator(mode="after")
    def _one_source(self) -> "LiveWatch":
        if (self.vllm_metrics is None) == (self.prometheus is None):
            raise ValueError("give vllm_metrics (a list of /metrics URLs) or prometheus (a URL)"
                             + (", not both" if self.vllm_metrics else ""))
        for url in (self.vllm_metrics or []) + ([self.prometheus] if self.prometheus else []):
            if not re.match(r"^https?://[^/\s]+", url):
                raise ValueError(f"{url!r} is not an http(s) URL; write it as http://host:port/...")
        if self.selector and self.prometheus is None:
            raise ValueError("selector applies to prometheus only; remove it")
        return self


class PublishSpec(_Strict):
    """Where a generation's recommendation goes when it clears the gate (daemon/publish.py)."""

    path: str | None = Field(None, description="a `vllm serve --config` YAML, replaced atomically on publish")
    min_gain: float = Field(0.05, ge=0, description="publish only a gain of at least this much over the "
                            "current configuration (0.05: 5%), beyond noise")
    webhook: str | None = Field(None, description="POST the published recommendation (JSON) here")
    webhook_attempts: int = Field(5, ge=1, le=20, description="tries before giving up (backoff doubles from 1 s)")
    webhook_secret_file: str | None = Field(None, description="a file holding the secret every webhook POST is "
                                            "signed with: X-Optimizer-Signature-256: sha256=<HMAC-SHA256 of the body>")

    @field_validator("webhook")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+", value):
            raise ValueError(f"{value!r} is not an http(s) URL; write it as http://host:port/path")
        return value


class DaemonSpec(_Strict):
    """`python -m optimizer daemon`: what to watch after the budget, and where to report (daemon/loop.py)."""

    watch: Annotated[Union[Annotated[str, Tag("path")], Annotated[LiveWatch, Tag("live")]],
                     Discriminator(lambda v: "path" if isinstance(v, str) else "live")] | None = Field(None, description="a trace file, or a directory new trace files "
                                          "land in (the workload must be scenario 'trace'); or live servers: "
                                          "{vllm_metrics: [URL, ...]} or {prometheus: URL, selector: ...}")
    poll_s: float = Field(30, ge=1, description="how often the watched source is read (at least 1 s: each "
                          "read is an HTTP request to every watched server or to Prometheus)")
    settle_s: float = Field(5, ge=0, description="a file younger than this is still being written: not read yet")
    threshold: float = Field(0.25, gt=0, description="relative change of a length quantile, the rate or the "
                             "concurrency that counts as new traffic (workload/drift.py for the others)")
    retune_every_h: float | None = Field(None, gt=0, description="re-tune on a schedule even without a change")
    slo_breach_s: float = Field(300, ge=0, description="live sources: production missing one of the study's SLOs "
                                "this long (its own latency histograms, every window) starts a generation on "
                                "the current window, once per breach; 0: never")
    warm_start: int = Field(3, ge=0, le=20, description="best configurations of the previous study queued first")
    on_change: Literal["auto", "wait", "abort"] = Field(
        "auto", description="a traffic change seen while a generation tunes (live sources): 'wait' for the "
        "generation to end, 'abort' it (its finished trials kept) and start on the new traffic, 'auto': abort "
        "only when the traffic turned saturated and what arrives changed")
    publish: PublishSpec = Field(default_factory=PublishSpec)
    status_host: str = "127.0.0.1"
    status_port: int = Field(8321, ge=0, le=65535)
