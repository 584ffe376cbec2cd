"""A stand-in for `python -m vllm.entrypoints.openai.api_server`, for tests of the server's
process handling without vLLM: an executable given to VllmServer as `python=` that answers
/health and /v1/models on the port it is handed, optionally after starting a child that
ignores SIGTERM (as an EngineCore busy starting up does).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

_SCRIPT = textwrap.dedent("""\
    #!{python}
    import subprocess, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    if {stubborn_child}:
        subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                          "time.sleep(600)"])
    port = int(sys.argv[sys.argv.index("--port") + 1])
    class Ok(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"{{}}")
        def log_message(self, *a):
            pass
    HTTPServer(("127.0.0.1", port), Ok).serve_forever()
""")


def write_stand_in(directory: Path, stubborn_child: bool = False) -> str:
    """The stand-in as an executable file in `directory`; its path."""
    exe = Path(directory) / "fake-python"
    exe.write_text(_SCRIPT.format(python=sys.executable, stubborn_child=stubborn_child))
    exe.chmod(0o755)
    return str(exe)
