"""Integration-suite guard: every vLLM server a test starts is gone when the suite ends.

(It caught a real leak: `start()` called inside `with VllmServer(...)` once launched a second
server and orphaned the first, which then skewed every later timing on the machine.)

Also the PostgreSQL server the storage and Ray-job tests use (`postgres_url`).
"""

import os
import subprocess
import time
from pathlib import Path

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


PG_URL_ENV = "VLLM_OPTIMIZER_TEST_PG_URL"
PG_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "postgres_for_tests.sh"


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """A PostgreSQL server's SQLAlchemy URL: $VLLM_OPTIMIZER_TEST_PG_URL, else the one
    scripts/postgres_for_tests.sh installs, starts and prints (idempotent; ~14 s the first time on
    a machine without PostgreSQL, <1 s afterwards). No server is a failure, never a skip."""
    url = os.environ.get(PG_URL_ENV)
    if url:
        return url
    try:
        run = subprocess.run(["bash", str(PG_SCRIPT)], capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"no PostgreSQL for the tests: {PG_SCRIPT.name} did not finish ({exc}); or set {PG_URL_ENV}",
                    pytrace=False)
    lines = run.stdout.strip().splitlines()
    if run.returncode != 0 or not lines or not lines[-1].startswith("postgresql://"):
        why = (run.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.fail(f"no PostgreSQL for the tests: {PG_SCRIPT.name} exited {run.returncode} ({why}); "
                    f"or set {PG_URL_ENV}", pytrace=False)
    return lines[-1]
