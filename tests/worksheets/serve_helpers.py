"""A ``worksheet serve`` server on a generated sheet, and the page's requests made with the standard library
(imported as ``import serve_helpers`` by the serve tests; no browser needed)."""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import threading
import urllib.error
import urllib.request

import numpy as np

from transformer_np.worksheets.generate import new_worksheet, write_worksheet
from transformer_np.worksheets.serve import SheetServer
from transformer_np.worksheets.serve_save import grid_shape


def sheet(tmp_path, **kwargs) -> str:
    """A fresh problem written by ``worksheet new`` (its empty [answers.layer1] template included): its path."""
    raw = new_worksheet(**kwargs)
    return write_worksheet(raw, str(tmp_path), f"sheet{kwargs.get('seed', 0)}")[0]


@contextlib.contextmanager
def running(path: str):
    """A server on ``path``, serving in a thread until the block ends."""
    server = SheetServer(path, port=0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def request(server, route: str, body=None, token: str | None = "", headers: dict | None = None):
    """(status, parsed JSON or bytes) of one request; ``token=""`` means the server's own, None none at all."""
    token = server.token if token == "" else token
    url = f"http://{server.host_header}{route}" + ("" if token is None else f"?token={token}")
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method="GET" if data is None else "POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, payload, ctype = r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        status, payload, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
    return status, (json.loads(payload) if ctype.startswith("application/json") else payload)


def raw_request(server, head: str, body: bytes = b"") -> tuple[int | None, bytes]:
    """Send ``head`` (request line and headers, without the final blank line) and ``body`` over a plain socket;
    returns (status or None if the connection closed without one, the response's first bytes)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.connect()
    sock = conn.sock
    sent = threading.Event()

    def push():
        try:
            sock.sendall(head.encode("latin-1") + b"\r\n\r\n")
            view = memoryview(body)
            for i in range(0, len(view), 1 << 16):
                sock.sendall(view[i:i + (1 << 16)])
        except OSError:                  # the server closed the connection: it did not read the rest
            pass
        finally:
            sent.set()

    pusher = threading.Thread(target=push, daemon=True)
    pusher.start()
    buf = io.BytesIO()
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf.write(chunk)
            if b"\r\n\r\n" in buf.getvalue():
                break
    except OSError:
        pass
    sent.wait(timeout=30)
    conn.close()
    data = buf.getvalue()
    if not data.startswith(b"HTTP/1."):
        return None, data
    return int(data.split(b" ", 2)[1]), data


def cells_of(answers: dict, ws, decimals: int) -> dict:
    """A worksheet's ``[answers]`` (as sheet_helpers.student gives them) as the page's cells: strings with the
    sheet's decimals, in the grid the page shows."""
    out: dict = {}
    for table, names in answers.items():
        for name, v in names.items():
            r, c = grid_shape(name, ws.n, ws.d_model, ws.d_ff)
            a = np.asarray(v, dtype=float).reshape(r, c)
            out.setdefault(table, {})[name] = [[_fmt(x, decimals) for x in row] for row in a]
    return out


def _fmt(x: float, dec: int) -> str:
    s = f"{x:.{dec}f}"
    return s.replace("-", "") if float(s) == 0 else s


def projection(d: dict) -> dict:
    """What the page shows of a report: every step's verdict and marks, the marks, the counts, the first mistake
    (its explanation in the page's Unicode notation: ``unicode_text`` of check's, and unchanged by it again)."""
    from transformer_np.worksheets.serve_page import unicode_text

    fm = d["first_mistake"]
    fm = None if fm is None else {**fm, "explanation": unicode_text(fm["explanation"])}
    return {"steps": [(s["layer"], s["name"], s["verdict"], s["marks"], s["out_of"]) for s in d["steps"]],
            "marks": d["marks"], "counts": d["counts"], "first_mistake": fm}
