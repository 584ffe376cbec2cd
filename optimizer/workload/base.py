"""The frozen values a workload is made of; they cross the Ray boundary as they are."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Request:
    id: str
    prompt_token_ids: tuple[int, ...]  # exact length, no tokenizer round trip
    max_tokens: int  # fixed output length (sent with ignore_eos)
    offset_s: float  # open loop: intended send time after the phase start; with `after`: delay after it ends
    after: str | None = None  # the request this one follows (an agent's next turn waits for the reply)

    @property
    def total_tokens(self) -> int:
        return len(self.prompt_token_ids) + self.max_tokens


@dataclass(frozen=True)
class Workload:
    name: str
    requests: tuple[Request, ...]  # the measured set
    warmup: tuple[Request, ...]  # never in the measured set
    concurrency: int | None  # closed loop: requests in flight; None: open loop on offsets
    description: str = ""
    notes: tuple[str, ...] = ()  # what the builder left out or changed, said out loud (skipped trace rows)

    def longest_request(self) -> int:
        """Tokens (prompt + output) of the longest request, warm-up included."""
        return max(r.total_tokens for r in self.requests + self.warmup)

    def content_hash(self) -> str:
        """sha256 of the requests and schedule: two workloads with equal hashes replay the same load.
        Computed once: it serializes every prompt, and the study, the file and the progress all ask."""
        cached = self.__dict__.get("_content_hash")
        if cached:
            return cached
        body = json.dumps({"requests": [asdict(r) for r in self.requests],
                           "warmup": [asdict(r) for r in self.warmup],
                           "concurrency": self.concurrency}, sort_keys=True)
        digest = hashlib.sha256(body.encode()).hexdigest()
        object.__setattr__(self, "_content_hash", digest)  # frozen: a cache, not a field
        return digest
