"""A local HTTP server for unit tests of parsing and of the one-line refusals (a page that is
not what the client expects): every GET answered by a function of its path, or with one fixed body."""

from __future__ import annotations

import http.server
import threading
from contextlib import contextmanager
from typing import Callable


@contextmanager
def serving_by_path(answer: Callable[[str], tuple[bytes, int]]):
    """Yields the server's base URL (http://127.0.0.1:<port>) while `answer(path)` gives each GET's (body, code)."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body, code = answer(self.path)
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()


@contextmanager
def serving(body: bytes, code: int = 200):
    """Yields the server's base URL while it answers every GET with `body`."""
    with serving_by_path(lambda path: (body, code)) as url:
        yield url
