"""driver/progress.py: a finished trial's line says what speculation did, from the server's own counters."""

from pathlib import Path

from optimizer.driver.progress import _speculation
from optimizer.engine.server_metrics import deltas, parse

PROM = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_metrics"


def test_a_speculating_trial_shows_its_acceptance_tokens_per_step_and_prefix_cache_hits():
    view = deltas(parse((PROM / "spec_before.prom").read_text()), parse((PROM / "spec_after.prom").read_text()))
    assert _speculation(view) == (f", speculation accepted {view['spec_acceptance']:.0%} "
                                  f"({view['spec_mean_accepted_length']:.2f} tokens/step), "
                                  f"prefix-cache hits {view['prefix_cache_hit_rate']:.0%}")
    assert _speculation(view).startswith(", speculation accepted 87% (4.49")  # 136 of 156 drafted, 39 drafts


def test_without_speculation_the_line_says_nothing_of_it():
    view = deltas(parse((PROM / "before.prom").read_text()), parse((PROM / "after.prom").read_text()))
    assert _speculation(view) == "" and _speculation({}) == ""
