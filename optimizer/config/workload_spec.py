"""The `workload:` section of a study config: one model per scenario, chosen by `scenario`.

Every scenario is seeded and says what it is made of (length spans, rates, spike shape,
prefix share); `arrival` says when requests are sent. A missing `scenario` means chat.
Validation happens here, at the door; the builders in this package trust these values.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, model_validator

from optimizer.config.base import Strict

Span = tuple[int, int]


def _check_spans(spec, *names: str) -> None:
    for name in names:
        low, high = getattr(spec, name)
        if low < 1 or low > high:
            raise ValueError(f"{name} [{low}, {high}] must be 1 <= low <= high")


_APPLIES = {"rate": ("constant", "poisson", "gamma", "ramp"), "burstiness": ("gamma", "ramp"),
            "start_rate": ("ramp",), "concurrency": ("closed",), "time_scale": ("trace",)}


def _no_trace_arrival(arrival) -> None:
    if arrival.process == "trace":
        raise ValueError("arrival 'trace' needs scenario 'trace' (a trace file with timestamps)")


class ArrivalSpec(Strict):
    """When requests are sent: an open-loop schedule, or a closed loop with `concurrency` in flight."""

    process: Literal["closed", "constant", "poisson", "gamma", "ramp", "trace"] = "closed"
    rate: float | None = Field(None, gt=0, description="requests/s (ramp: the final rate)")
    burstiness: float = Field(1.0, gt=0, description="gamma/ramp: gap shape; 1 = Poisson, < 1 burstier")
    start_rate: float | None = Field(None, gt=0, description="ramp: the first rate, requests/s")
    concurrency: int | None = Field(None, ge=1, description="closed: requests in flight")
    time_scale: float = Field(1.0, gt=0, description="trace: gaps multiplied by this (0.5 = twice as fast)")

    @model_validator(mode="after")
    def _check(self) -> "ArrivalSpec":
        p = self.process
        for knob, processes in _APPLIES.items():
            if knob in self.model_fields_set and p not in processes:
                raise ValueError(f"{knob} does not apply to process '{p}' (only {', '.join(processes)}); "
                                 "remove it or change the process")
        if p == "closed" and self.concurrency is None:
            raise ValueError("process 'closed' needs concurrency (requests in flight)")
        if p in ("constant", "poisson", "gamma", "ramp") and self.rate is None:
            raise ValueError(f"process '{p}' needs rate (requests/s)")
        if p == "ramp" and self.start_rate is None:
            raise ValueError("process 'ramp' needs start_rate (requests/s at the first request)")
        return self


class _Common(Strict):
    seed: int = 0
    warmup_requests: int = Field(4, ge=0, description="sent before the measured set, never part of it")


class ChatSpec(_Common):
    """Short questions and some long documents, fixed output lengths."""

    scenario: Literal["chat"] = "chat"
    requests: int = Field(64, ge=1)
    long_share: float = Field(0.2, ge=0, le=1, description="share of long-document prompts")
    short_input: Span = (16, 128)
    long_input: Span = (1024, 3072)
    output: Span = (32, 128)
    arrival: ArrivalSpec = Field(default_factory=lambda: ArrivalSpec(process="closed", concurrency=32))

    @model_validator(mode="after")
    def _check(self) -> "ChatSpec":
        _check_spans(self, "short_input", "long_input", "output")
        _no_trace_arrival(self.arrival)
        return self


class TextSpec(_Common):
    """Real text through the model's tokenizer and chat template: passages asked back (copy-heavy)
    and open questions (workload/text/scenario.py)."""

    scenario: Literal["text"] = "text"
    requests: int = Field(32, ge=1)
    copy_share: float = Field(0.5, ge=0, le=1, description="share of requests that quote a passage back "
                              "(RAG answers, rewrites, code edits); the rest are open questions")
    output: Span = Field((64, 128), description="open questions' output tokens (a quote is as long as its passage)")
    arrival: ArrivalSpec = Field(default_factory=lambda: ArrivalSpec(process="closed", concurrency=8))

    @model_validator(mode="after")
    def _check(self) -> "TextSpec":
        _check_spans(self, "output")
        _no_trace_arrival(self.arrival)
        return self


class BatchSpec(_Common):
    """Offline work: everything queued at once (or `concurrency` at a time); throughput is all."""

    scenario: Literal["batch"] = "batch"
    requests: int = Field(256, ge=1)
    input: Span = (128, 1024)
    output: Span = (128, 512)
    concurrency: int | None = Field(None, ge=1, description="requests in flight; none = all at once")

    @model_validator(mode="after")
    def _check(self) -> "BatchSpec":
        _check_spans(self, "input", "output")
        return self


class RagSpec(_Common):
    """Questions over a few long shared documents (system prompt / few-shot prefix): prefix caching matters."""

    scenario: Literal["rag"] = "rag"
    requests: int = Field(96, ge=1)
    documents: int = Field(4, ge=1, description="distinct shared prefixes")
    prefix_tokens: Span = (1024, 2048)
    prefix_share: float = Field(0.9, ge=0, le=1, description="share of requests on a shared prefix; the rest unique")
    question: Span = (16, 64)
    output: Span = (32, 128)
    arrival: ArrivalSpec = Field(default_factory=lambda: ArrivalSpec(process="poisson", rate=2.0))

    @model_validator(mode="after")
    def _check(self) -> "RagSpec":
        _check_spans(self, "prefix_tokens", "question", "output")
        _no_trace_arrival(self.arrival)
        return self


class BurstSpec(_Common):
    """A steady base rate with sharp spikes (Poisson within each stretch)."""

    scenario: Literal["burst"] = "burst"
    requests: int = Field(120, ge=1)
    input: Span = (32, 512)
    output: Span = (32, 128)
    base_rate: float = Field(1.0, gt=0, description="requests/s between spikes")
    spike_rate: float = Field(12.0, gt=0, description="requests/s during a spike")
    spike_every_s: float = Field(20.0, gt=0, description="one spike starts every this many seconds")
    spike_duration_s: float = Field(3.0, gt=0)
    first_spike_s: float = Field(5.0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> "BurstSpec":
        _check_spans(self, "input", "output")
        if self.spike_duration_s >= self.spike_every_s:
            raise ValueError(f"spike_duration_s ({self.spike_duration_s}) must be below spike_every_s "
                             f"({self.spike_every_s}); otherwise it is one long spike")
        return self


class AgentSpec(_Common):
    """Multi-turn tool-call loops: each session's context grows turn by turn (its previous prompt,
    the model's call, the tool's result), tool results span tens to tens of thousands of tokens,
    and sessions start in bursts."""

    scenario: Literal["agent"] = "agent"
    sessions: int = Field(8, ge=1)
    turns: Span = (2, 6)
    system_tokens: int = Field(1024, ge=0, description="tool definitions shared by every session")
    user_input: Span = (32, 256)
    tool_result: Span = Field((16, 16384), description="drawn log-uniformly: tens to tens of thousands")
    output: Span = (16, 128)
    think_s: tuple[float, float] = Field((0.0, 1.0), description="tool run time between a reply and the next call")
    max_context: int = Field(32768, ge=2, description="a session ends before its prompt would exceed this")
    arrival: ArrivalSpec = Field(default_factory=lambda: ArrivalSpec(process="gamma", rate=0.5, burstiness=0.3),
                                 description="when sessions start")

    @model_validator(mode="after")
    def _check(self) -> "AgentSpec":
        _check_spans(self, "turns", "user_input", "tool_result", "output")
        low, high = self.think_s
        if low < 0 or low > high:
            raise ValueError(f"think_s [{low}, {high}] must be 0 <= low <= high")
        _no_trace_arrival(self.arrival)
        if self.system_tokens + self.user_input[1] + self.output[1] > self.max_context:
            raise ValueError(f"max_context ({self.max_context}) cannot hold the first turn "
                             f"(system_tokens + user_input + output); raise it")
        return self


class TraceSpec(_Common):
    """Replay a recorded trace: ShareGPT, BurstGPT, Azure, Mooncake or the generic JSONL."""

    scenario: Literal["trace"] = "trace"
    path: str
    format: Literal["auto", "sharegpt", "burstgpt", "azure", "mooncake", "jsonl"] = "auto"
    skip_bad_rows: bool = Field(False, description="replay the good rows of a trace with malformed ones")
    max_requests: int | None = Field(None, ge=1, description="the first N rows only")
    max_output_tokens: int | None = Field(None, ge=1, description="cap replies (ShareGPT replies can be long)")
    arrival: ArrivalSpec = Field(default_factory=lambda: ArrivalSpec(process="trace"))


class ObservedSpec(_Common):
    """Replay traffic the daemon observed on live vLLM servers (a traffic window file it wrote) as a
    seeded workload of the same shape: lengths, rate, burstiness, prefix-cache hit rate."""

    scenario: Literal["observed"] = "observed"
    path: str | None = Field(None, description="a traffic window file (JSON) the daemon wrote; left out under a "
                             "daemon watching live servers, which fills it in with each window it tunes on")
    requests: int = Field(200, ge=1, description="requests drawn; they arrive at the observed rate (under the "
                          "daemon: this when written here, else daemon.watch.requests)")
    max_model_len: int | None = Field(None, ge=2, description="the longest request (prompt + output tokens) the "
                                      "watched servers admit; drawn lengths are cut to it (under the daemon: the "
                                      "shorter of what production admits and a --max-model-len engine.extra_args "
                                      "pins for every trial)")


WorkloadSpec = Annotated[Union[ChatSpec, BatchSpec, RagSpec, BurstSpec, AgentSpec, TraceSpec, ObservedSpec,
                               TextSpec],
                         Field(discriminator="scenario")]


def with_default_scenario(data):
    """A `workload:` mapping without `scenario` is the chat mix."""
    if isinstance(data, dict) and "scenario" not in data:
        return {**data, "scenario": "chat"}
    return data
