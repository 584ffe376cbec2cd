"""traffic/prometheus.py: the label selector is checked before anything is asked (the queries
themselves run against a real Prometheus in tests/integration/test_daemon_live_traffic.py)."""

import json

import pytest

from optimizer.errors import ConfigError
from optimizer.traffic.prometheus import PrometheusSource, check_selector
from tests.unit.page_server import serving


def test_a_selector_is_written_in_braces():
    assert check_selector('{job="vllm"}') == '{job="vllm"}'
    assert check_selector("") == ""
    with pytest.raises(ConfigError, match="is not a label selector; write it in braces"):
        check_selector('job="vllm"')


def test_the_source_names_its_server_and_selector():
    src = PrometheusSource("http://127.0.0.1:9090/", '{job="vllm"}', 600, 60)
    assert src.url == "http://127.0.0.1:9090" and src.describe() == 'Prometheus http://127.0.0.1:9090 {job="vllm"}'
    assert src._m("vllm:request_success_total") == 'vllm:request_success_total{job="vllm"}'


def test_an_answer_of_another_shape_is_a_reported_failure_not_a_crash():
    # "success", but a bucket row without its `le` label
    odd = json.dumps({"status": "success", "data": {"resultType": "vector",
                                                    "result": [{"metric": {}, "value": [1, "3"]}]}}).encode()
    with serving(odd) as url:
        src = PrometheusSource(url, "", 600, 30)
        errors = src.poll()
        assert len(errors) == 1 and "answered a query with rows of another shape (KeyError" in errors[0]
        assert src.window() is None


def test_the_rejections_query_keeps_the_selectors_targets_and_drops_its_model_name():
    """http_requests_total is the API server's, with no model_name label: a model_name matcher would
    match nothing and read every window as 0 rejections. A trailing comma is valid PromQL too."""
    from optimizer.traffic.prometheus import PrometheusSource

    def query(selector):
        return PrometheusSource("http://p:9090", selector, 60, 5)._http("4xx")

    tail = 'method="POST", handler=~"/v1/.*", status="4xx"}'
    assert query("") == "http_requests_total{" + tail
    assert query('{job="vllm", model_name="llama"}') == 'http_requests_total{job="vllm", ' + tail
    assert query('{job="vllm",}') == 'http_requests_total{job="vllm", ' + tail
    assert query('{model_name=~"l.*", instance="a:8000"}') == 'http_requests_total{instance="a:8000", ' + tail
