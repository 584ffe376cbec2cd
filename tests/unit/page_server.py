"""A local HTTP server answering every GET with one fixed body, for unit tests of parsing and of
the one-line refusals (a page that is not what the client expects)."""

from __future__ import annotations

import http.server
import threading
from contextlib import contextmanager


@contextmanager
def serving(body: bytes, code: int = 200):
    """Yields the server's base URL (http://127.0.0.1:<port>) while it answers `body`."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
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
