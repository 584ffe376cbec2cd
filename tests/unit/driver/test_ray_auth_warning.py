"""driver/ray_runtime.py `unauthenticated_join`: joining a Ray cluster without RAY_AUTH_MODE=token is
warned about (a client cannot tell before joining whether the cluster checks tokens); the embedded
Ray and a token-authenticated join are not."""

from optimizer.driver.ray_runtime import unauthenticated_join


def test_a_join_without_token_auth_is_warned_about(monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    line = unauthenticated_join("10.0.0.10:6379")
    assert line.startswith("joining Ray at '10.0.0.10:6379' without RAY_AUTH_MODE=token")
    assert unauthenticated_join("auto") is not None  # a job's RAY_ADDRESS, or a running local head
    assert unauthenticated_join(None) is None and unauthenticated_join("local") is None  # the embedded Ray
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    assert unauthenticated_join("10.0.0.10:6379") is None
