"""VllmServer: one process group per server, started once, stopped completely.

A stand-in for `python -m vllm.entrypoints.openai.api_server` (an executable given as
`python=`) answers /health and /v1/models on the port it is handed, so the lifecycle runs
in a second without vLLM.
"""

import sys
import textwrap

import psutil

from optimizer.engine.vllm import VllmServer

STAND_IN = textwrap.dedent(f"""\
    #!{sys.executable}
    import sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    port = int(sys.argv[sys.argv.index("--port") + 1])
    class Ok(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"{{}}")
        def log_message(self, *a):
            pass
    HTTPServer(("127.0.0.1", port), Ok).serve_forever()
""")


def stand_in(tmp_path):
    exe = tmp_path / "fake-python"
    exe.write_text(STAND_IN)
    exe.chmod(0o755)
    return str(exe)


def test_start_inside_with_launches_one_server_only(tmp_path):
    first_arg = stand_in(tmp_path)  # the stand-in runs as `python <its path> ...`
    with VllmServer("m", [], tmp_path / "log", python=first_arg, startup_timeout=20) as srv:
        assert srv.state == "ready"
        first = srv.proc.pid
        assert srv.start() is True  # the old trap: a second start() orphaned the first server
        assert srv.proc.pid == first
        servers = [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or ["", ""])[1:2] == [first_arg]]
        assert len(servers) == 1 and servers[0].parent().pid == first  # one server, under its guard
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
    report = srv.stop()  # stopping twice is harmless
    assert report.leftover_pids == () and report.port_free
