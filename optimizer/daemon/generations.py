"""A daemon generation's name, the latest generation a storage holds, the config replaying a
generation's source (a trace file, or a live traffic window cut to what production admits), and
what production showed in that window (stamped on the generation's study)."""

from __future__ import annotations

import re
from pathlib import Path

from optimizer.config.daemon_spec import LiveWatch
from optimizer.config.schema import StudyConfig
from optimizer.daemon.observing import observed_spec
from optimizer.driver.store.database import study_attrs

_GENERATION = re.compile(r"^(?P<base>.+)-g(?P<n>\d+)$")


def generation_name(base: str, n: int) -> str:
    return base if n == 1 else f"{base}-g{n}"


def latest_generation(storage_url: str, base: str) -> tuple[int, dict]:
    """The highest generation of `base` in the storage and its study's user attributes ((1, {}) if none)."""
    best, attrs = 0, {}
    for name, study_attrs_ in study_attrs(storage_url):
        m = _GENERATION.match(name)
        n = 1 if name == base else int(m["n"]) if m and m["base"] == base else 0
        if n > best:
            best, attrs = n, study_attrs_
    return max(best, 1), attrs


def with_source(cfg: StudyConfig, source: Path | None, admits: int | None = None) -> StudyConfig:
    """The config replaying `source`: a trace file, or (live servers) a traffic window file, its
    lengths cut to `admits` (what production admits, when read from the servers)."""
    if source is None:
        return cfg
    live = cfg.daemon.watch
    if isinstance(live, LiveWatch):
        return cfg.model_copy(update={"workload": observed_spec(cfg, live, source, admits)})
    return cfg.model_copy(update={"workload": cfg.workload.model_copy(update={"path": str(source)})})


FLAGS_SEEN = {"gpu_memory_utilization": "gpu-memory-utilization", "cache_dtype": "kv-cache-dtype",
              "block_size": "block-size", "enable_prefix_caching": "enable-prefix-caching"}


def production_of(window) -> dict:
    """What the watched servers showed in the window: their latencies and the flags their
    `vllm:cache_config_info` exposes (vLLM's names)."""
    flags = {flag: window.cache_config[key] for key, flag in FLAGS_SEEN.items() if key in window.cache_config}
    return {"latencies": window.production(), "flags": flags, "requests": round(window.requests, 1),
            "rate": round(window.rate, 4), "start": window.start, "end": window.end, "source": window.source}
