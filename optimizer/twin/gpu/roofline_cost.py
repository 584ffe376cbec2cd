"""The step cost of a GPU not owned: `plan --what-if`'s fitted roofline (whatif/roofline.py), applied
to each step vLLM's scheduler lays out instead of to a mean request.

A step of p prompt tokens and d decoding sequences (contexts known per token) costs the larger of

    memory   the weights the step touches (`Architecture.bytes_read(p + d)`: a mixture of experts reads
             the experts its tokens route to) / TP, plus the decoding sequences' cached tokens x KV
             bytes a token, over the datasheet's bandwidth x the fitted efficiency;
    compute  the FLOPs of p + d tokens at their contexts (attention grows with the context; only the
             decoding tokens compute logits) / TP over the dense peak x the fitted efficiency,

plus the fitted per-layer overhead and, with TP > 1, two ring all-reduces a layer. `intake_s` is the
roofline's fitted per-request time (HTTP, tokenizing). Nothing here was measured on the device: it is
the published-row fit of docs/what-if.md, so its band is the roofline's own, not the twin's.
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.twin.step_cost import StepShape
from optimizer.whatif.architecture import Architecture
from optimizer.whatif.devices import DeviceSpec
from optimizer.whatif.roofline import FITTED, Efficiency, Serving, allreduce_time, kv_bytes_per_token, peak_flops


@dataclass(frozen=True)
class RooflineStepCost:
    arch: Architecture
    device: DeviceSpec
    serving: Serving
    eff: Efficiency = FITTED
    name: str = "roofline (fitted on published measurements)"

    @property
    def intake_s(self) -> float:
        return self.eff.request_s

    def seconds(self, shape: StepShape) -> float:
        a, tp = self.arch, max(1, self.serving.tp)
        tokens = shape.prefill_tokens + shape.decode_seqs
        if tokens <= 0:
            return 0.0
        kv = kv_bytes_per_token(a, self.serving)
        read = a.bytes_read(tokens) / tp + shape.decode_context * 1000 * kv
        memory = read / (self.device.bandwidth_gbs * 1e9 * self.eff.bandwidth)
        f0 = a.flops_per_token(0.0, logits=False)
        per_context = a.flops_per_token(1.0, logits=False) - f0  # attention: linear in the context
        head = a.flops_per_token(0.0) - f0
        flops = (tokens * f0 + per_context * (shape.prefill_attention + shape.decode_context) * 1000
                 + shape.decode_seqs * head)
        compute = flops / tp / peak_flops(self.device, a, self.eff)
        return max(memory, compute) + a.layers * self.eff.layer_s + allreduce_time(a, self.device, tokens, tp, self.eff)
