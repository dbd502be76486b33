"""A pass-through HTTP proxy that records whether each request asked for a stream.

The test puts it between verifiers' eval client and a real `vf-serve`: vf-serve's own log does not
say whether a call streamed, so the proxy notes each request's `stream` field and the content type
the server answered with, and relays the bytes unchanged (SSE chunk by chunk).

    with RecordingProxy(server.base_url) as proxy:
        ...  # point the client at proxy.base_url
    proxy.calls  # [Call("/v1/chat/completions", stream=True, content_type="text/event-stream")]
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}


@dataclass
class Call:
    """One relayed request: its path, its body's `stream` flag, the upstream content type."""

    path: str
    stream: bool
    content_type: str


class RecordingProxy:
    """Relays every request to `upstream` (a `.../v1` base url) and records it in `calls`."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.removesuffix("/v1")
        self.calls: list[Call] = []
        self._client = httpx.AsyncClient(timeout=300)
        app = Starlette(routes=[Route("/{path:path}", self._relay, methods=["GET", "POST"])])
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                         daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1"

    async def _relay(self, request: Request) -> StreamingResponse:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        upstream = await self._client.send(
            self._client.build_request(request.method, self.upstream + request.url.path,
                                       headers=headers, content=body), stream=True)
        asked = json.loads(body).get("stream", False) if body else False
        content_type = upstream.headers.get("content-type", "")
        self.calls.append(Call(request.url.path, bool(asked), content_type))
        return StreamingResponse(upstream.aiter_raw(), status_code=upstream.status_code,
                                 headers={"content-type": content_type},
                                 background=BackgroundTask(upstream.aclose))

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the recording proxy did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
