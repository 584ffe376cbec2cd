"""optimizer/http_open.py: a proxy named in the environment never carries the tool's calls to
127.0.0.1 (urllib's own urlopen would send them there). Refused redirects: the webhook's tests
(tests/unit/daemon/test_publish.py), whose receiver answers 302 with a Location."""

import urllib.error
import urllib.request

import pytest

from optimizer.http_open import is_loopback, urlopen
from tests.unit.page_server import serving


def test_loopback_addresses():
    assert is_loopback("http://127.0.0.1:8000/health") and is_loopback("http://localhost/x")
    assert is_loopback("http://[::1]:9/") and is_loopback("http://127.8.0.1/")
    assert not is_loopback("http://10.0.0.5:8000/metrics") and not is_loopback("https://hooks.example/x")


def test_a_proxy_in_the_environment_does_not_carry_local_calls(monkeypatch):
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:1")  # a proxy that refuses every connection
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    with serving(b"ok") as url:
        with pytest.raises(urllib.error.URLError):  # what urllib alone does with it (a fresh opener reads the env)
            urllib.request.build_opener().open(f"{url}/health", timeout=5)
        with urlopen(f"{url}/health", timeout=5) as resp:
            assert resp.read() == b"ok"

