"""moto S3 server on 127.0.0.1 with a WSGI wrapper that logs requests, counts response body
bytes and injects 403 AccessDenied for any key containing "/forbidden/".

    server = CountingMotoServer(port=0); server.start()
    host, port = server.get_host_and_port()   # endpoint_url = f"http://{host}:{port}"
    server.bytes_served / server.log / server.agents (each request's User-Agent) / server.reset()
    server, storage_options = moto_s3()        # started, with bucket "corpus"
"""

from __future__ import annotations

import threading

from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

_ACCESS_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
    b"<Message>Access Denied</Message><RequestId>fake</RequestId></Error>"
)


class CountingMotoServer(ThreadedMotoServer):
    def __init__(self, ip_address: str = "127.0.0.1", port: int = 0, verbose: bool = False):
        super().__init__(ip_address=ip_address, port=port, verbose=verbose)
        self.log: list[tuple[str, str, str | None, int, int]] = []  # method, path, range, status, bytes
        self.agents: list[str] = []  # each logged request's User-Agent
        self._lock = threading.Lock()

    @property
    def bytes_served(self) -> int:
        """Body bytes of GET responses (object reads + listings)."""
        return sum(r[4] for r in self.log if r[0] == "GET")

    def reset(self) -> None:
        with self._lock:
            self.log.clear()
            self.agents.clear()

    def _wrap(self, app):
        def middleware(environ, start_response):
            method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
            rng = environ.get("HTTP_RANGE")
            status_holder = {}

            def sr(status, headers, exc_info=None):
                status_holder["status"] = int(status.split()[0])
                return start_response(status, headers, exc_info)

            if "/forbidden/" in path:
                body = b"" if method == "HEAD" else _ACCESS_DENIED
                start_response(
                    "403 Forbidden",
                    [("Content-Type", "application/xml"), ("Content-Length", str(len(_ACCESS_DENIED)))],
                )
                with self._lock:
                    self.log.append((method, path, rng, 403, len(body)))
                    self.agents.append(environ.get("HTTP_USER_AGENT", ""))
                return [body]
            n = 0
            chunks = []
            for chunk in app(environ, sr):
                n += len(chunk)
                chunks.append(chunk)
            with self._lock:
                self.log.append(
                    (method, path, rng, status_holder.get("status", 0), n if method != "HEAD" else 0)
                )
                self.agents.append(environ.get("HTTP_USER_AGENT", ""))
            return chunks

        return middleware

    def _server_entry(self) -> None:  # same as moto's, with the app wrapped
        app = self._wrap(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(
            self._ip_address, self._port, app, True, request_handler=MotoRequestHandler
        )
        self._server_ready_event.set()
        self._server.serve_forever()


def moto_s3(bucket: str = "corpus") -> tuple[CountingMotoServer, dict]:
    """A started moto S3 server on 127.0.0.1 with an empty ``bucket``: (the server, the
    ``storage_options`` that point ``s3://`` datasets at it)."""
    import boto3

    server = CountingMotoServer(port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    storage = {
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "skip_instance_cache": True,
    }
    return server, storage
