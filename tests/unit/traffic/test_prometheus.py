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


def test_an_answer_of_another_shape_is_a_reported_failure_not_a_crash():
    import http.server
    import json
    import threading

    class Odd(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # "success", but a bucket row without its `le` label
            body = json.dumps({"status": "success", "data": {"resultType": "vector",
                                                             "result": [{"metric": {}, "value": [1, "3"]}]}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Odd)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        src = PrometheusSource(f"http://127.0.0.1:{srv.server_address[1]}", "", 600, 30)
        errors = src.poll()
        assert len(errors) == 1 and "answered a query with rows of another shape (KeyError" in errors[0]
        assert src.window() is None
    finally:
        srv.shutdown()
