"""Integration-suite guard: every vLLM server a test starts is gone when the suite ends.

(It caught a real leak: `start()` called inside `with VllmServer(...)` once launched a second
server and orphaned the first, which then skewed every later timing on the machine.)
"""

import time

import psutil
import pytest

SERVER = "vllm.entrypoints.openai.api_server"


def _servers() -> set[int]:
    return {p.pid for p in psutil.process_iter(["cmdline"]) if SERVER in " ".join(p.info["cmdline"] or [])}


@pytest.fixture(scope="session", autouse=True)
def no_server_outlives_the_suite():
    before = _servers()
    yield
    deadline = time.monotonic() + 30
    while (left := _servers() - before) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, f"vLLM servers left running by the integration tests: {sorted(left)}"
