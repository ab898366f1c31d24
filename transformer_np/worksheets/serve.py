r"""``transformer-np worksheet serve SHEET``: a local page to fill in a worksheet and see each step marked.

The server is the standard library's :mod:`http.server` (no framework). It serves one sheet, and is safe by
construction:

* it listens on 127.0.0.1 only;
* its URL carries a random token (``?token=…``, as Jupyter does) that every request must present, in the query
  or as ``Authorization: token …`` — without it the answer is 403 and nothing is read or written;
* the ``Host`` header must be exactly the loopback address and port it was started with (``127.0.0.1:PORT``),
  so a web page whose own host name resolves to 127.0.0.1 (DNS rebinding) is refused;
* a request body must declare its length and is refused (413, unread) above ``MAX_BODY`` bytes; a slow client
  times out; no request names a file: the routes are fixed (``/``, ``/static/serve.js``, ``/static/serve.css``,
  ``/api/state``, ``/api/answers``, ``/download``) and the only file written is the sheet, atomically;
* it stops on Ctrl-C and after ``idle_timeout`` seconds without an accepted request.

The answers the page sends are written into the sheet's TOML (:mod:`.serve_save`: the problem untouched), then
the saved file is marked with :func:`transformer_np.check` — the same call ``transformer-np check`` makes — and
the page shows that report's verdicts, marks and first mistake (:func:`.serve_page.page_report`).

    >>> from transformer_np.worksheets.serve import SheetServer
    >>> server = SheetServer("my_sheet.toml", port=0)      # doctest: +SKIP
    >>> print(server.url)                                  # doctest: +SKIP
    http://127.0.0.1:41234/?token=…
    >>> server.run(idle_timeout=3600)                      # doctest: +SKIP
"""

from __future__ import annotations

import hmac
import http.server
import json
import os
import secrets
import sys
import threading
import time
import urllib.parse
from importlib import resources

from ..errors import InputValueError, WorksheetError
from .serve_save import MAX_CELL_CHARS, max_cells, save_answers

__all__ = ["SheetServer", "serve", "redirect_file", "MAX_BODY", "HOST", "IDLE_TIMEOUT"]

HOST = "127.0.0.1"
# The largest answer set a page can send: every cell of the largest sheet (LIMITS), each a string of at most
# MAX_CELL_CHARS characters with its quotes and comma, plus the JSON's keys and brackets: well under 1 MiB.
MAX_BODY = 1 << 20
IDLE_TIMEOUT = 3600.0          # seconds without an accepted request before the server stops
SOCKET_TIMEOUT = 20.0          # seconds a connection may stay silent (a slow client cannot hold a thread)
STATIC = {"/static/serve.js": ("serve.js", "text/javascript; charset=utf-8"),
          "/static/serve.css": ("serve.css", "text/css; charset=utf-8")}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")

assert max_cells() * (MAX_CELL_CHARS + 4) < MAX_BODY // 2, "MAX_BODY must hold the largest sheet's answers"


def _asset(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "transformer-np"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = SOCKET_TIMEOUT
    server: SheetServer

    def log_message(self, format, *args):       # quiet: the terminal is the user's
        pass

    # ------------------------------------------------------------------ responses
    def _send(self, status: int, body: bytes, ctype: str, extra: dict | None = None) -> None:
        self.send_response(status)
        headers = {"Content-Type": ctype, "Content-Length": str(len(body)), "Cache-Control": "no-store",
                   "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                   "X-Frame-Options": "DENY", "Content-Security-Policy": CSP, **(extra or {})}
        if self.close_connection:
            headers["Connection"] = "close"
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj) -> None:
        self._send(status, json.dumps(obj, allow_nan=False).encode(), "application/json; charset=utf-8")

    def _refuse(self, status: int, why: str) -> None:
        self.close_connection = True
        self._json(status, {"error": why})

    # ------------------------------------------------------------------ the gate every request passes
    def _gate(self) -> dict | None:
        """The query's parameters if the request may be served, else None (the refusal already sent)."""
        host = self.headers.get_all("Host") or []
        if len(host) != 1 or host[0].strip().lower() != self.server.host_header:
            self._refuse(403, "foreign Host header: open the page at the address the server printed")
            return None
        split = urllib.parse.urlsplit(self.path)
        try:
            query = urllib.parse.parse_qs(split.query, max_num_fields=4, strict_parsing=False)
        except ValueError:
            self._refuse(400, "malformed query")
            return None
        given = (query.get("token") or [""])[0]
        auth = self.headers.get("Authorization", "")
        if not given and auth.lower().startswith("token "):
            given = auth[6:].strip()
        if not hmac.compare_digest(given.encode(), self.server.token.encode()):
            self._refuse(403, "missing or wrong token: open the page at the address the server printed")
            return None
        origin = self.headers.get("Origin")
        if origin is not None and origin.lower() != f"http://{self.server.host_header}":
            self._refuse(403, "request from a foreign origin")
            return None
        self.server.touch()
        return {"path": split.path}

    # ------------------------------------------------------------------ routes
    def do_GET(self):                               # http.server's names
        gate = self._gate()
        if gate is None:
            return
        path = gate["path"]
        if path == "/":
            page = _asset("index.html").decode().replace("{{TOKEN}}", self.server.token)
            self._send(200, page.encode(), "text/html; charset=utf-8")
        elif path in STATIC:
            name, ctype = STATIC[path]
            self._send(200, _asset(name), ctype)
        elif path == "/api/state":
            self._state()
        elif path == "/download":
            self._download()
        else:
            self._refuse(404, "no such page")

    def do_POST(self):
        gate = self._gate()
        if gate is None:
            return
        if gate["path"] != "/api/answers":
            self._refuse(404, "no such page")
            return
        body = self._body()
        if body is None:
            return
        try:
            msg = json.loads(body)
        except (ValueError, RecursionError):
            self._refuse(400, "the request is not JSON")
            return
        if not isinstance(msg, dict) or not isinstance(msg.get("fingerprint"), str) or "answers" not in msg:
            self._refuse(400, "expected {\"fingerprint\": …, \"answers\": {…}}")
            return
        self._json(200, self.server.save_and_mark(msg["answers"], msg["fingerprint"], msg.get("seq")))

    def _body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding") is not None:
            self._refuse(411, "a request body must give its Content-Length (no chunked encoding)")
            return None
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if ctype != "application/json":
            self._refuse(415, "the body must be application/json")
            return None
        raw = self.headers.get("Content-Length")
        if raw is None or not raw.strip().isdigit():
            self._refuse(411, "a request body must give its Content-Length")
            return None
        length = int(raw)
        if length > MAX_BODY:
            self._refuse(413, f"request body of {length} bytes refused: at most {MAX_BODY} are read")
            return None
        data = self.rfile.read(length)
        if len(data) != length:
            self._refuse(400, "the request body ended early")
            return None
        return data

    def _state(self) -> None:
        try:
            state = self.server.state()
        except (WorksheetError, OSError) as e:
            self._json(409, {"error": str(e)})
            return
        self._json(200, state)

    def _download(self) -> None:
        try:
            with self.server.lock:
                data = _read_bounded(self.server.path)
        except (WorksheetError, OSError) as e:
            self._refuse(409, str(e))
            return
        name = os.path.basename(self.server.path)
        ascii_name = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in name) or "sheet.toml"
        self._send(200, data, "application/toml; charset=utf-8",
                   {"Content-Disposition": f"attachment; filename=\"{ascii_name}\"; "
                                           f"filename*=UTF-8''{urllib.parse.quote(name)}"})


def _read_bounded(path: str) -> bytes:
    from .._files import read_bytes_bounded
    from .tomlio import MAX_FILE_BYTES

    return read_bytes_bounded(path, MAX_FILE_BYTES, error=WorksheetError, what="worksheet file")


class SheetServer(http.server.ThreadingHTTPServer):
    """The server of one sheet: ``url`` (with its token) is the page's address. ``run()`` serves until Ctrl-C or
    ``idle_timeout`` seconds without an accepted request; ``serve_forever()``/``shutdown()`` (from
    :mod:`socketserver`) serve in a thread, as the tests do."""

    daemon_threads = True
    allow_reuse_address = False        # never share a port another process is listening on
    request_queue_size = 16

    def __init__(self, sheet: str | os.PathLike, port: int = 0):
        from . import check

        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise InputValueError(f"--port: expected an integer in [0, 65535] (0: any free port), got {port!r}")
        path = os.path.realpath(os.fspath(sheet))
        if not os.path.isfile(path):
            raise WorksheetError(f"{os.fspath(sheet)}: no such worksheet file")
        check(path)                                           # a sheet check refuses is refused here, named
        self.path = path
        self.token = secrets.token_urlsafe(32)
        self.lock = threading.Lock()                          # one save-and-mark at a time
        self.last_activity = time.monotonic()
        try:
            super().__init__((HOST, port), _Handler)
        except OSError as e:
            raise InputValueError(f"--port: cannot listen on {HOST}:{port} ({e.strerror or e}); give another "
                                  f"port, or 0 for any free one") from None
        self.port = self.server_address[1]
        self.host_header = f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host_header}/?token={self.token}"

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    def state(self) -> dict:
        from .serve_page import page_state

        with self.lock:
            return page_state(self.path)

    def save_and_mark(self, cells, fingerprint: str, seq=None) -> dict:
        """Save the page's cells into the sheet, then mark the saved sheet with ``check``. A save that fails
        (malformed cells, a changed problem, an unwritable file) is reported and the sheet is left as it was;
        the page is then shown the marking of the sheet as it is on disk."""
        from . import check
        from .serve_page import page_report

        with self.lock:
            out = {"seq": seq if isinstance(seq, int) and not isinstance(seq, bool) else None,
                   "saved": False, "save_error": None, "not_saved": [], "report": None, "error": None}
            try:
                cells = save_answers(self.path, cells, fingerprint)
                out["saved"], out["not_saved"] = True, cells.not_saved
            except (WorksheetError, OSError) as e:
                out["save_error"] = str(e)
            try:
                out["report"] = page_report(check(self.path))
            except (WorksheetError, OSError) as e:
                out["error"] = str(e)
            return out

    def run(self, idle_timeout: float = IDLE_TIMEOUT, log=None) -> str:
        """Serve until Ctrl-C or ``idle_timeout`` seconds without an accepted request; returns why it stopped."""
        log = log or (lambda s: print(s, file=sys.stderr, flush=True))
        thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        why = "idle"
        try:                         # started inside the try: a Ctrl-C right after the first request still stops here
            thread.start()
            while time.monotonic() - self.last_activity < idle_timeout:
                time.sleep(min(0.5, max(idle_timeout / 10, 0.05)))
            log(f"Stopped: no request for {idle_timeout:g} s (the answers are saved in {self.path}).")
        except KeyboardInterrupt:
            why = "interrupted"
            log(f"Stopped (Ctrl-C). The answers are saved in {self.path}.")
        finally:
            if thread.ident is not None:       # shutdown() waits for serve_forever: only if its thread ran
                self.shutdown()
            self.server_close()
            thread.join(timeout=5)
        return why


def serve(sheet, port: int = 0, open_browser: bool = True, idle_timeout: float = IDLE_TIMEOUT, out=None) -> str:
    """Serve ``sheet`` (``transformer-np worksheet serve``): print the page's URL, open it, serve until Ctrl-C
    or the idle timeout. Returns why the server stopped (``"interrupted"`` or ``"idle"``)."""
    out = out or sys.stdout
    if isinstance(idle_timeout, bool) or not isinstance(idle_timeout, (int, float)) or not idle_timeout > 0:
        raise InputValueError(f"--idle-timeout: expected a positive number of seconds, got {idle_timeout!r}")
    server = SheetServer(sheet, port)
    print(f"Serving {server.path}\nOpen this address in a browser (it carries the page's token):\n\n"
          f"    {server.url}\n\nCtrl-C stops the server; it also stops after {idle_timeout:g} s without a request.",
          file=out, flush=True)
    redirect = None
    if open_browser:
        import webbrowser

        redirect = redirect_file(server.url)
        threading.Thread(target=webbrowser.open, args=(redirect.as_uri(),), daemon=True).start()
    try:
        return server.run(idle_timeout)
    finally:
        if redirect is not None:
            _remove_redirect(redirect)


_REDIRECT = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="0;url={url}">
<title>Opening the worksheet…</title></head>
<body><p>Opening <a href="{url}">the worksheet page</a>…</p></body></html>
"""


def redirect_file(url: str):
    """A page that sends the browser on to ``url``, in a new folder only the user can enter (0700), the file
    readable by the user alone (0600): the browser is opened on this file, so the token is never on a command
    line (which other local users can read while the browser runs), as Jupyter does. Returns its path."""
    import html
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp(prefix="transformer-np-serve-"))        # mkdtemp: mode 0700
    path = folder / "open.html"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(_REDIRECT.format(url=html.escape(url, quote=True)))
    return path


def _remove_redirect(path) -> None:
    try:
        path.unlink()
        path.parent.rmdir()
    except OSError:
        pass
