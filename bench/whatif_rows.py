"""The published measurements of bench/data/published_vllm.csv as cases the what-if estimate can
be run on: the model's shape, the device, TP, the load (closed at a concurrency, or a burst of
requests sent at once), and the measured TTFT, TPOT and output throughput.

A row the estimate cannot be run on is kept with the reason (a device the table lacks, a
Poisson rate: the estimate models closed loops and bursts). Shared by bench/whatif_fit.py and
bench/whatif_validation.py.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, replace
from pathlib import Path

from optimizer.config.kv_fit import GPU_NON_KV_MIN, GPU_NON_KV_SHARE
from optimizer.whatif import architecture, devices
from optimizer.whatif.architecture import Architecture
from optimizer.whatif.roofline import Load, Serving

DATA = Path(__file__).resolve().parent / "data"
MODELS = DATA / "models"
# The CSV's model -> (where its config.json is, quantization when the config does not say it).
# Bundled: the configs aiconfigurator-core ships; bench/data/models: bench/data/models/SOURCES.md.
CONFIGS = {
    "Qwen/Qwen3-32B": ("Qwen/Qwen3-32B", None),
    "nvidia/Llama-3.1-8B-Instruct-FP8": ("meta-llama/Meta-Llama-3.1-8B", "fp8"),
    # fp8: these rows ran at TP 1 on one H200 (141 GB), where 141 GB of bf16 weights cannot
    "meta-llama/Llama-3.1-70B": ("meta-llama/Meta-Llama-3.1-70B", "fp8"),
    "openai/gpt-oss-120b": ("openai/gpt-oss-120b", None),
    "Qwen/Qwen3-235B-A22B-FP8": ("Qwen/Qwen3-235B-A22B-FP8", None),
    "MiniMaxAI/MiniMax-M2.5": ("MiniMaxAI/MiniMax-M2.5", None),
    "meta-llama/Llama-3.1-405B-Instruct": ("meta-llama/Meta-Llama-3.1-405B", None),
    "Qwen/Qwen3-VL-32B-Instruct-FP8": ("Qwen/Qwen3-VL-32B-Instruct", "fp8"),
    "Qwen/Qwen2-7B-Instruct": (str(MODELS / "Qwen--Qwen2-7B-Instruct"), None),
    "Qwen/Qwen2.5-32B": (str(MODELS / "Qwen--Qwen2.5-32B"), None),
    "neuralmagic/Llama-3.2-11B-Vision-Instruct-FP8-dynamic":
        (str(MODELS / "neuralmagic--Llama-3.2-11B-Vision-Instruct-FP8-dynamic"), None),
    "neuralmagic/Meta-Llama-3-8B-Instruct-FP8": (str(MODELS / "neuralmagic--Meta-Llama-3-8B-Instruct-FP8"), None),
}
DEVICES = {"H100 SXM": "h100", "H200 SXM": "h200", "A100 80GB": "a100", "MI300X": "mi300x", "B200": "b200",
           "L4": "l4", "H100 NVL": "h100-nvl", "L40S": "l40s", "L40 (not L40S)": "l40"}


@dataclass(frozen=True)
class Case:
    index: int  # the CSV row, from 1
    model: str
    device: str  # the CSV's name
    tp: int
    load: Load | None
    serving: Serving
    measured: dict  # ttft_s, tpot_s, throughput: those the source gives
    library_rows: bool  # measured by aiconfigurator's authors (never validates their library)
    source: str = ""  # config.json's source for the estimate
    quantization: str | None = None
    skip: str = ""  # why the estimate cannot be run on it
    cached: int = 0  # the first this many of the run's prompts were in the server's prefix cache before it (notes)

    def arch(self) -> Architecture:
        arch = architecture.load(self.source)
        return replace(arch, quantization=self.quantization) if self.quantization else arch

    def spec(self) -> devices.DeviceSpec:
        return devices.known(DEVICES[self.device])

    @property
    def dense(self) -> bool:
        return self.arch().experts == 0

    @property
    def label(self) -> str:
        shape = f"{self.load.isl}/{self.load.osl}" if self.load else "?"
        how = ("burst " if self.load and self.load.burst else "c") + (str(self.load.concurrency) if self.load else "?")
        return f"{self.index:>2} {self.model.split('/')[-1][:24]:<24} {self.device[:9]:<9} tp{self.tp} {shape} {how}"


def _num(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _from_notes(notes: str) -> tuple[int | None, float | None, float | None]:
    """(requests, mean prompt tokens, mean output tokens) the notes state."""
    n = re.search(r"--num-prompts?[ =](\d+)|\((\d+) prompts", notes)
    requests = int(next(g for g in n.groups() if g)) if n else None
    both = re.search(r"(\d+) input / (\d+) generated tokens(?: over (\d+) requests)?", notes)
    gen = re.search(r"total generated tokens (\d+) over (\d+) requests", notes)
    if both:
        over = int(both.group(3) or requests or 0)
        return requests or over, int(both.group(1)) / over, int(both.group(2)) / over
    if gen:
        return requests or int(gen.group(2)), None, int(gen.group(1)) / int(gen.group(2))
    return requests, None, None


def _cached(notes: str) -> int:
    """How many of the run's first prompts its server had cached before it, where the notes say (a
    benchmark's initial test prompt, and the same seed's prompts from the server's earlier runs)."""
    m = re.search(r"prefix cache before the run: the first (\d+)", notes)
    return int(m.group(1)) if m else 0


def _measured(row: dict) -> dict:
    out = {}
    for key, cols, scale in (("ttft_s", ("ttft_mean_ms", "ttft_median_ms"), 1e-3),
                             ("tpot_s", ("tpot_mean_ms", "tpot_median_ms"), 1e-3),
                             ("throughput", ("output_throughput_tok_s",), 1.0)):
        value = next((_num(row[c]) for c in cols if _num(row[c])), None)
        if value:
            out[key] = value * scale
    return out


def cases(path: Path = DATA / "published_vllm.csv") -> list[Case]:
    out = []
    for i, row in enumerate(csv.DictReader(path.open()), start=1):
        notes = row["notes"]
        requests, isl_notes, osl_notes = _from_notes(row["dataset"] + "; " + notes)
        isl = _num(row["input_tokens"]) or isl_notes
        osl = _num(row["output_tokens"]) or osl_notes
        concurrency = _num(row["concurrency"])
        seqs = re.search(r"--max-num-seqs (\d+)", notes)
        util = re.search(r"gpu-memory-utilization (0\.\d+)", notes)
        serving = Serving(tp=int(row["tp"]), max_num_seqs=int(seqs.group(1)) if seqs else 256,
                          utilization=float(util.group(1)) if util else 0.9)
        skip, load = "", None
        if row["device"] not in DEVICES:
            skip = f"{row['device']}: not in the device table"
        elif _num(row["request_rate"]):
            skip = f"Poisson arrivals at {row['request_rate']} req/s: the estimate models closed loops and bursts"
        elif not (isl and osl and (concurrency or requests)):
            skip = "the source does not give the prompt and output lengths and the load"
        else:
            load = Load(round(isl), round(osl), int(concurrency or requests), burst=not concurrency)
        source, quant = CONFIGS[row["model"]]
        case = Case(i, row["model"], row["device"], int(row["tp"]), load, serving, _measured(row),
                    "AICONFIGURATOR" in notes, source, quant, skip, _cached(notes))
        kv = re.search(r"KV cache (\d+\.\d+) GiB", notes)
        if kv and not util and not skip:  # the KV cache the engine log states sets the memory fraction
            case = replace(case, serving=replace(serving, utilization=_fraction_for(case, float(kv.group(1)))))
        out.append(case)
    return out


def _fraction_for(case: Case, kv_gib: float) -> float:
    """The memory fraction at which the estimate's KV cache is `kv_gib` (the roofline's arithmetic)."""
    device, arch = case.spec(), case.arch()
    runtime = max(GPU_NON_KV_MIN, GPU_NON_KV_SHARE * device.memory_bytes)
    return min(0.99, (kv_gib * 2**30 + arch.weight_bytes / case.tp + runtime) / device.memory_bytes)
