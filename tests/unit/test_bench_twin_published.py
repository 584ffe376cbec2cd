"""bench/twin_published.py's replay of a burst on the prefix cache its server had: the published
rows' notes say how many of a burst's prompts were cached, and the burst is replayed after them."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import twin_published as tp  # noqa: E402
import whatif_rows  # noqa: E402

from optimizer.errors import OptimizerError  # noqa: E402
from optimizer.measure.replay import ReplayResult, RequestRecord  # noqa: E402


def test_the_notes_say_how_many_prompts_were_cached_and_the_a100_bursts_carry_them():
    assert whatif_rows._cached("bf16; prefix cache before the run: the first 20 of these prompts (log)") == 20
    assert whatif_rows._cached("bf16; prefix caching enabled") == 0
    cached = {c.load.concurrency: c.cached for c in whatif_rows.cases()
              if c.device == "A100 80GB" and c.model == "Qwen/Qwen2-7B-Instruct"}
    assert cached == {1: 1, 10: 1, 20: 20, 50: 1, 100: 1, 200: 100}  # the test prompt; 50 and 30, then 100 before


def test_the_cached_prompts_go_first_with_the_bursts_own_tokens_and_the_burst_long_after():
    burst = tp._requests(64, 32, 5, 0.2)
    sent = tp._after_warm_cache(burst, 2)
    warm, again = sent[:2], sent[2:]
    assert [r.prompt_token_ids for r in warm] == [r.prompt_token_ids for r in burst[:2]]
    assert all(r.max_tokens == 1 and r.offset_s == 0.0 and r.id.startswith(tp.WARM) for r in warm)
    assert [r.id for r in again] == [r.id for r in burst] and all(r.offset_s == tp.AFTER_S for r in again)


def _rec(rid: str, sent: float, end: float, ok: bool = True) -> RequestRecord:
    return RequestRecord(rid, sent, sent, sent + 0.1, end, (), 64, 32, 32, ok, 200)


def test_the_bursts_window_is_its_own_and_a_warm_up_still_running_is_refused():
    result = ReplayResult((_rec(f"{tp.WARM}req-0", 0.0, 0.2), _rec("req-0", 3600.0, 3603.0),
                           _rec("req-1", 3600.0, 3604.0), _rec("req-2", 3600.0, 0.0, ok=False)), 3604.0)
    assert tp._window(result) == pytest.approx(4.0)
    late = ReplayResult((_rec(f"{tp.WARM}req-0", 0.0, 3700.0), _rec("req-0", 3600.0, 3603.0)), 3700.0)
    with pytest.raises(OptimizerError):
        tp._window(late)
