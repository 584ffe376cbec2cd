"""Output regression: does a candidate server still pick the same tokens as the baseline?

Method. Each prompt of a fixed set is sent alone (one request at a time: batching can change
the numerics; outputs/speculation_check.py also sends them `batch` at a time) to `/v1/completions` with greedy decoding (`temperature: 0`), `ignore_eos`, a
fixed length and the top-k logprobs of every generated token. The reference (baseline) and
candidate outputs are then compared token by token, per prompt, up to and including the first
position where they differ (a *flip*), and no further: decoding is free-running, so after a
flip the two continuations have different prefixes and later positions say nothing about
per-token agreement. `compared_tokens` counts the positions compared under identical prefixes
and the top-1 flip rate is flips / compared_tokens (at most one flip per prompt): an estimate
of the probability that one decoding step picks a different token.

A flip's margin is how close the call was in the reference run, in nats: the reference's
logprob of its own (greedy, hence top-1) token minus its logprob of the candidate's token,
or None when the candidate's token is not among the reference's top-k ("beyond top-k").
`candidate_margin` is the same from the candidate's side. Near-zero margins are near-ties
that any numeric change can flip; large ones mean the candidate computes something else.
"""

from __future__ import annotations

import http.client
import json
import statistics
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace

from optimizer.errors import first_line

DEFAULT_PROMPTS: tuple[str, ...] = (
    "Question: What is the capital of Australia, and why was it chosen over Sydney? Answer:",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "List five fruits that are high in vitamin C:\n1.",
    "A train leaves at 3 pm travelling 60 miles per hour. A second train leaves the same station "
    "at 4 pm travelling 80 miles per hour. At what time does the second train catch up? Solution:",
    "Summarize in one sentence: The city council voted on Tuesday to expand the bike lane network "
    "by forty kilometres over the next three years, citing rising ridership and fewer accidents. "
    "Summary:",
    "Translate into French: The library opens at nine in the morning.\nFrench:",
    "Once upon a time, in a village at the edge of a great forest, there lived",
    "User: My laptop battery drains very fast. What should I check first?\nAssistant:",
    "SELECT name, COUNT(*) FROM orders",
    "The three states of matter are",
    "Write a haiku about the sea in autumn.\n",
    "Explain to a ten-year-old why the sky is blue.",
)


@dataclass(frozen=True)
class Output:
    """One greedy completion: per generated position, the chosen token (as "token_id:N"), its
    logprob, and the top-k alternatives {token: logprob} the server returned."""

    prompt_index: int
    tokens: tuple[str, ...]
    logprobs: tuple[float, ...]
    top: tuple[dict[str, float], ...]
    batch: int = 1  # how many prompts were in flight when it was answered (1: alone on the server)

    def __post_init__(self):
        if not len(self.tokens) == len(self.logprobs) == len(self.top):
            raise ValueError(f"prompt {self.prompt_index}: {len(self.tokens)} tokens, {len(self.logprobs)} "
                             f"logprobs, {len(self.top)} top-k entries (must be equal)")

    def to_dict(self) -> dict:
        return {"prompt_index": self.prompt_index, "tokens": list(self.tokens),
                "logprobs": list(self.logprobs), "top": [dict(t) for t in self.top], "batch": self.batch}

    @classmethod
    def from_dict(cls, d: dict) -> Output:
        return cls(int(d["prompt_index"]), tuple(d["tokens"]), tuple(float(x) for x in d["logprobs"]),
                   tuple({str(k): float(v) for k, v in t.items()} for t in d["top"]), int(d.get("batch", 1)))


def request_body(model: str, prompt: str, max_tokens: int, top_k: int) -> dict:
    """The JSON POSTed for one prompt (`top_k` is vLLM's `logprobs`, capped by the server's
    --max-logprobs, 20 by default; it is not the `top_k` sampling parameter)."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "logprobs": top_k, "ignore_eos": True, "return_tokens_as_token_ids": True, "seed": 0}


def parse_completion(prompt_index: int, body: dict) -> Output:
    """The Output in a non-streamed /v1/completions response body (OpenAI legacy logprobs:
    choices[0].logprobs.{tokens, token_logprobs, top_logprobs}). Raises ValueError naming the
    prompt when the body has no logprobs or they are malformed."""
    try:
        lp = body["choices"][0]["logprobs"]
        tokens, logprobs, top = lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"prompt {prompt_index}: response has no choices[0].logprobs "
                         f"({type(exc).__name__}: {exc})") from exc
    if any(x is None for x in logprobs):
        raise ValueError(f"prompt {prompt_index}: a generated token has no logprob")
    return Output(prompt_index, tuple(tokens), tuple(float(x) for x in logprobs),
                  tuple({str(k): float(v) for k, v in (t or {}).items()} for t in top))


def collect(base_url: str, model: str, prompts: Sequence[str], max_tokens: int = 32, top_k: int = 5,
            timeout: float = 120, batch: int = 1) -> list[Output]:
    """Greedy outputs of `prompts` on the server at `base_url`, in prompt order: one request at a time,
    or `batch` in flight at once (the numerics of a batch, which speculation's check compares at equal
    batch sizes). Raises RuntimeError naming the prompt (and the HTTP status and body start) on any failure."""
    url = base_url.rstrip("/") + "/v1/completions"
    # No proxy from the environment (as aiohttp's default): the server is local or on the cluster.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def one(i: int, prompt: str) -> Output:
        data = json.dumps(request_body(model, prompt, max_tokens, top_k)).encode()
        req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        try:
            with opener.open(req, timeout=timeout) as resp:
                body = json.loads(resp.read())
            return replace(parse_completion(i, body), batch=batch)
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")[:200]
            raise RuntimeError(f"prompt {i}: HTTP {exc.code} from {url}: {text}") from exc
        except (OSError, http.client.HTTPException, ValueError) as exc:  # refused, timeout, bad JSON/logprobs
            raise RuntimeError(f"prompt {i}: {url}: {first_line(exc)}") from exc

    batch = min(batch, len(prompts))  # never more in flight than there are prompts, nor recorded as such
    if batch <= 1:
        return [one(i, p) for i, p in enumerate(prompts)]
    with ThreadPoolExecutor(max_workers=batch) as pool:
        return list(pool.map(one, range(len(prompts)), prompts))


def collect_both(base_url: str, model: str, prompts, max_tokens: int, top_k: int, batch: int) -> list:
    """The prompts' greedy outputs alone, and with `batch` above 1 also `batch` at a time."""
    outputs = collect(base_url, model, prompts, max_tokens=max_tokens, top_k=top_k)
    if min(batch, len(prompts)) > 1:
        outputs += collect(base_url, model, prompts, max_tokens=max_tokens, top_k=top_k, batch=batch)
    return outputs


@dataclass(frozen=True)
class Flip:
    """The first position where a prompt's candidate token differs from the reference's."""

    prompt: int  # the prompt's index
    position: int
    reference: str  # the reference's token there ("token_id:N")
    candidate: str  # the candidate's token there
    margin: float | None  # reference: own token's logprob - candidate token's; None = beyond its top-k
    candidate_margin: float | None  # the same, from the candidate's side


@dataclass(frozen=True)
class Comparison:
    prompts: int
    compared_tokens: int
    flips: tuple[Flip, ...]
    first_divergence: tuple[int | None, ...]  # per prompt, in prompt-index order

    @property
    def flip_rate(self) -> float:
        return len(self.flips) / self.compared_tokens if self.compared_tokens else 0.0

    @property
    def prompts_diverged(self) -> int:
        return sum(p is not None for p in self.first_divergence)

    def to_dict(self) -> dict:
        return {"prompts": self.prompts, "compared_tokens": self.compared_tokens, "flip_rate": self.flip_rate,
                "prompts_diverged": self.prompts_diverged, "first_divergence": list(self.first_divergence),
                "flips": [asdict(f) for f in self.flips]}

    def summary(self) -> str:
        text = (f"top-1 flip rate {self.flip_rate:.3f} ({len(self.flips)} of {self.compared_tokens} tokens; "
                f"{self.prompts_diverged} of {self.prompts} prompts diverge")
        if not self.flips:
            return text + ")"
        firsts = ", ".join(str(p) for p in sorted(p for p in self.first_divergence if p is not None))
        text += f", first at token{'s' if self.prompts_diverged > 1 else ''} {firsts}"
        margins = [f.margin for f in self.flips if f.margin is not None]
        beyond = len(self.flips) - len(margins)
        parts = []
        if margins:
            lo, hi = min(margins), max(margins)
            parts.append(f"margins {lo:.2f}-{hi:.2f} nats" if len(margins) > 1 else f"margin {lo:.2f} nats")
        if beyond:
            parts.append(f"{beyond} beyond top-k")
        return text + "; " + ", ".join(parts) + ")"


def _margin(own_logprob: float, top: dict[str, float], other: str) -> float | None:
    return own_logprob - top[other] if other in top else None


def compare(reference: list[Output], candidate: list[Output]) -> Comparison:
    """Compare two runs of the same prompts (matched by prompt index) under the method in the
    module docstring: per prompt, positions up to and including the first flip. Raises
    ValueError when the two lists do not cover the same prompts exactly once each."""
    ref = {o.prompt_index: o for o in reference}
    cand = {o.prompt_index: o for o in candidate}
    if len(ref) != len(reference) or len(cand) != len(candidate):
        raise ValueError("a prompt index appears twice in one run")
    if ref.keys() != cand.keys():
        raise ValueError(f"the runs cover different prompts: only in reference {sorted(ref.keys() - cand.keys())}, "
                         f"only in candidate {sorted(cand.keys() - ref.keys())}")
    compared, flips, firsts = 0, [], []
    for idx in sorted(ref):
        r, c = ref[idx], cand[idx]
        n = min(len(r.tokens), len(c.tokens))
        pos = next((p for p in range(n) if r.tokens[p] != c.tokens[p]), None)
        firsts.append(pos)
        compared += n if pos is None else pos + 1
        if pos is not None:
            rt, ct = r.tokens[pos], c.tokens[pos]
            flips.append(Flip(idx, pos, rt, ct, _margin(r.logprobs[pos], r.top[pos], ct),
                              _margin(c.logprobs[pos], c.top[pos], rt)))
    return Comparison(len(ref), compared, tuple(flips), tuple(firsts))


def exceeds(comparison: Comparison, max_flip_rate: float) -> bool:
    """True when the comparison's top-1 flip rate is above `max_flip_rate` (reject the candidate)."""
    return comparison.flip_rate > max_flip_rate


def median_gap(outputs: list[Output]) -> float | None:
    """The median, over every generated position, of how far the chosen token's logprob leads the
    best alternative in the top-k (nats): how close the calls a numeric change could flip are."""
    gaps = []
    for o in outputs:
        for chosen, own, top in zip(o.tokens, o.logprobs, o.top):
            others = [lp for tok, lp in top.items() if tok != chosen]
            if others:
                gaps.append(own - max(others))
    return statistics.median(gaps) if gaps else None
