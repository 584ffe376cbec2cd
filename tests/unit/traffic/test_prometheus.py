"""traffic/prometheus.py: the label selector is checked before anything is asked (the queries
themselves run against a real Prometheus in tests/integration/test_daemon_live_traffic.py)."""

import pytest

from optimizer.errors import ConfigError
from optimizer.traffic.prometheus import PrometheusSource, check_selector


def test_a_selector_is_written_in_braces():
    assert check_selector('{job="vllm"}') == '{job="vllm"}'
    assert check_selector("") == ""
    with pytest.raises(ConfigError, match="is not a label selector; write it in braces"):
        check_selector('job="vllm"')


def test_the_source_names_its_server_and_selector():
    src = PrometheusSource("http://127.0.0.1:9090/", '{job="vllm"}', 600, 60)
    assert src.url == "http://127.0.0.1:9090" and src.describe() == 'Prometheus http://127.0.0.1:9090 {job="vllm"}'
    assert src._m("vllm:request_success_total") == 'vllm:request_success_total{job="vllm"}'
