"""A web server on 127.0.0.1 (a free port), run on a daemon thread of the environment's process."""

from __future__ import annotations

import functools
import sys
import threading
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer


class QuietStaticHandler(SimpleHTTPRequestHandler):
    """Serves files without logging every request to stderr; text is declared UTF-8 (pages without a
    ``<meta charset>`` would otherwise be read as Latin-1). The files do not change while the server
    runs, so the browser may keep them: without a Cache-Control header Chromium fetched every script
    again on every page load (MiniWoB's core.js, d3 and stylesheet: four requests an episode)."""

    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, ".html": "text/html; charset=utf-8",
                      ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "max-age=86400")
        super().end_headers()

    def log_message(self, format, *args) -> None:  # noqa: A002 - the stdlib's signature
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """A browser that drops a request half-served (its page closed or moved on) is not an error
        worth a traceback on stderr; anything else still gets the stdlib's report."""
        if isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipeError, ConnectionResetError
            return
        super().handle_error(request, client_address)


class LocalServer:
    """``handler`` served at :attr:`url` until :meth:`close`."""

    def __init__(self, handler: type[BaseHTTPRequestHandler] | functools.partial):
        self._server = _Server(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/"
        self._thread = threading.Thread(target=self._server.serve_forever, name="posttrain-web-server", daemon=True)
        self._thread.start()

    @classmethod
    def static(cls, directory: str) -> "LocalServer":
        return cls(functools.partial(QuietStaticHandler, directory=directory))

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
