"""The step cost of a GPU not owned, from aiconfigurator-core's per-operation timings (measured with
vLLM by the library's authors on A100, H100, H200, B200, L40S), applied to each step vLLM's scheduler
lays out.

A step of p prompt tokens and d decoding sequences is three passes, each asked of the library's
compiled step engine (`EngineHandle`, 3-6 us a call):

    shared     every operation but attention (embedding, norms, the QKV, projection and FFN GEMMs,
               logits, and the all-reduces at the TP size) over p + d tokens
    prefill    context attention, chunk by chunk: a chunk of k tokens after c computed ones
               attends to c + k / 2 tokens a token, which is what the library charges a chunk of
               a 2c + k-token prompt (its attention over the whole prompt, divided by its number
               of chunks)
    decode     generation attention of the d sequences at their mean context

A decode-only step is the library's decode step at the mean context. `intake_s` is the library's
own per-request CPU-side dispatch overhead for vLLM (0.8 ms a layer, fitted by its authors to
their measurements), which no kernel timing contains.

The library is handed the model as whatif/library.py hands it (a local directory or a copy of the
config.json, the KV cache's precision, fp8 weights where undeclared), never a Hub id. A device it
has no vLLM timings for, or a model it cannot build, gives the reason instead, and the roofline's
step cost answers (twin/gpu/server.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from optimizer.twin.step_cost import StepShape
from optimizer.whatif import library
from optimizer.whatif.architecture import Architecture
from optimizer.whatif.devices import DeviceSpec
from optimizer.whatif.roofline import Serving

_OSL = 2  # the library's decode context is isl + osl // 2 + 1: osl 2 puts it at the given context + 2


@dataclass
class LibraryStepCost:
    handle: object  # aiconfigurator_core.sdk.engine.EngineHandle for the model, device, TP and precisions
    intake_s: float
    name: str
    _cache: dict = field(default_factory=dict, repr=False)

    def seconds(self, shape: StepShape) -> float:
        p, d = shape.prefill_tokens, shape.decode_seqs
        if p + d <= 0:
            return 0.0
        dctx = max(1, round(shape.decode_context * 1000 / d)) if d else 1
        if p == 0:
            return self._decode_step(d, dctx) / 1000
        # each chunk of k tokens after c computed ones: the attention of a chunk of a 2c + k-token prompt
        chunks = shape.chunks or ((p, shape.prefill_attention * 1000 / p - p / 2),)  # one chunk at the mean context
        attention = sum(self._context(k, max(1, round(2 * before + k))) for k, before in chunks)
        return (self._shared(p, d) + attention + (self._decode_attention(d, dctx) if d else 0.0)) / 1000

    def _decode_step(self, d: int, context: int) -> float:
        key = ("decode", d, context)
        if key not in self._cache:
            self._cache[key] = float(self.handle.decode_step_latency(d, context, _OSL))
        return self._cache[key]

    def _shared(self, p: int, d: int) -> float:
        """Every operation but attention over p + d tokens, in ms."""
        key = ("shared", p, d)
        if key not in self._cache:
            shared, _, _ = self.handle._mixed_step_breakdown_per_op_with_metadata(p, d, p, _OSL, 0)
            self._cache[key] = sum(op[1] for op in shared)
        return self._cache[key]

    def _context(self, k: int, span: int) -> float:
        """The context attention of a chunk of k tokens of a `span`-token prompt, in ms."""
        key = ("context", k, span)
        if key not in self._cache:
            _, context, _ = self.handle._mixed_step_breakdown_per_op_with_metadata(k, 0, span, _OSL, 0)
            self._cache[key] = sum(op[1] for op in context)
        return self._cache[key]

    def _decode_attention(self, d: int, context: int) -> float:
        key = ("attention", d, context)
        if key not in self._cache:
            ops = self.handle._decode_step_per_op_with_metadata(d, context, _OSL)
            self._cache[key] = sum(op[1] for op in ops if op[0] == "generation_attention")
        return self._cache[key]


def library_step_cost(source: str, arch: Architecture, device: DeviceSpec, serving: Serving) -> LibraryStepCost | str:
    """aiconfigurator-core's step cost for this model, device, TP and precisions, or why there is none."""
    if not library.covered(device):
        name = library.NAME
        return f"{name} has no vLLM timings for {device.name}" if library.version() else f"{name} is not installed"
    try:
        from aiconfigurator_core.sdk import ModelConfig  # noqa: PLC0415
        from aiconfigurator_core.sdk.backends.factory import get_backend  # noqa: PLC0415
        from aiconfigurator_core.sdk.models import get_model  # noqa: PLC0415
        from aiconfigurator_core.sdk.rust_engine_step import _cached_engine_handle  # noqa: PLC0415

        logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
        db = library.database(device)
        config = ModelConfig(tp_size=serving.tp, **library.modes(source, arch, serving))
        model = get_model(library.model_ref(source), config, "vllm")
        handle = _cached_engine_handle(model, db)
        handle.decode_step_latency(1, 16, _OSL)  # a model the engine cannot step fails here, not mid-replay
        intake = get_backend("vllm")._prefill_dispatch_overhead_ms(model) / 1000
    except Exception as exc:  # the library refuses a model or a shape in many ways: one line, then the roofline
        return f"{library.NAME} could not build {arch.name} on {device.name}: {str(exc).splitlines()[0][:160]}"
    version = library.data_version(device)
    return LibraryStepCost(handle, intake, f"{library.NAME}'s per-operation vLLM timings on {device.name} "
                                           f"(measured with vLLM {version})")
