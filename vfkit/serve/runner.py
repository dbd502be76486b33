"""Running the server: in the foreground (`vf-serve`), or in a background thread of this process.

with BackgroundServer(ServeConfig("path/to/model", dtype="float32")) as server:
    client = openai.OpenAI(base_url=server.base_url, api_key="x")
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import uvicorn

from vfkit.errors import ServerError
from vfkit.serve.app import create_app
from vfkit.serve.config import ServeConfig
from vfkit.serve.launcher import bind_error
from vfkit.serve.model import build_engine

log = logging.getLogger("vfkit.serve")


def serve_forever(config: ServeConfig) -> None:
    """Check the port, load the model, and serve until SIGINT/SIGTERM."""
    check_port(config.host, config.port)  # a busy port fails now, not after the model loads
    engine = build_engine(config)
    app = create_app(engine, config)
    log.info("serving %s on http://%s:%d/v1", config.model_id, config.host, config.port)
    try:
        uvicorn.run(
            app,
            host=config.host,
            port=config.port,
            log_level=config.log_level,
            timeout_graceful_shutdown=5,
        )
    finally:
        engine.stop()


def check_port(host: str, port: int) -> None:
    """ServerError naming --port unless host:port can be bound now (uvicorn binds it later: a
    port taken in between still fails there, with uvicorn's own error)."""
    if (why := bind_error(host, port)) is not None:
        raise ServerError(
            f"--port {port} on {host} is not free ({why}); stop what listens there, or choose "
            "another --port (or --host)"
        )


class BackgroundServer:
    """The embedded server on 127.0.0.1:<free port> in a daemon thread (tests, notebooks)."""

    def __init__(self, config: ServeConfig, *, engine=None) -> None:
        self.config = config
        self.engine = engine or build_engine(config)
        self.app = create_app(self.engine, config)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((config.host, 0))
        self.port = self._sock.getsockname()[1]
        self._server = uvicorn.Server(
            uvicorn.Config(self.app, log_level="warning", timeout_graceful_shutdown=2)
        )
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}/v1"

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ServerError("the background server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self.engine.stop()
        self._sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
