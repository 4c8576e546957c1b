"""A plain HTTP file server on 127.0.0.1 for tests: Python's own, plus range requests.

Like most static servers it sends Last-Modified and no ETag (``dates = False``: nothing that
names a version). ``answer`` makes it answer every request with one status and body instead
(e.g. 503, as a store that is down).

    server = FileServer(folder).start()   # server.url + "/name.jsonl"
    server.answer = (503, b"...")         # None: serve files again
    server.dates = False                  # no Last-Modified either
    server.requests / server.stop()
"""

from __future__ import annotations

import functools
import os
import re
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class FileServer:
    def __init__(self, folder: str):
        handler = functools.partial(_Handler, directory=folder)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.owner = self
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.answer: tuple[int, bytes] | None = None
        self.dates = True
        self.requests = 0

    def start(self) -> FileServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass

    def send_header(self, keyword, value):
        if keyword != "Last-Modified" or self.server.owner.dates:
            super().send_header(keyword, value)

    def do_HEAD(self):
        if not self._answered(head=True):
            super().do_HEAD()

    def do_GET(self):
        if self._answered(head=False):
            return
        match = _RANGE.match(self.headers.get("Range", ""))
        path = self.translate_path(self.path)
        if match is None or not os.path.isfile(path):
            return super().do_GET()
        with open(path, "rb") as f:
            data, mtime = f.read(), os.fstat(f.fileno()).st_mtime
        start, stop = int(match[1]), min(len(data), int(match[2] or len(data) - 1) + 1)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}")
        self.send_header("Content-Length", str(stop - start))
        self.send_header("Last-Modified", self.date_time_string(mtime))
        self.end_headers()
        self.wfile.write(data[start:stop])

    def _answered(self, head: bool) -> bool:
        owner = self.server.owner
        owner.requests += 1
        if owner.answer is None:
            return False
        status, body = owner.answer
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)
        return True


SLOW_DOWN = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"


def s3_answering_503(folder: str) -> tuple[FileServer, dict]:
    """A started server that answers every request as an S3 store that is down (503 SlowDown),
    and the ``storage_options`` that point an ``s3://`` dataset at it."""
    server = FileServer(folder).start()
    server.answer = (503, SLOW_DOWN)
    storage = {
        "client_kwargs": {"endpoint_url": server.url, "region_name": "us-east-1"},
        "skip_instance_cache": True,
    }
    return server, storage
