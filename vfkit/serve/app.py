"""The HTTP side: OpenAI/vLLM routes over an `Engine`, API-key auth, OpenAI-style errors.

engine = build_engine(ServeConfig("path/to/model"))
uvicorn.run(create_app(engine, config), host="127.0.0.1", port=8000)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from functools import partial
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException

from vfkit.serve.config import ServeConfig

if TYPE_CHECKING:
    from vfkit.serve.engine import Engine
from vfkit.serve.errors import APIError, validation_error
from vfkit.serve.limits import BodyLimit, refuse_unsupported
from vfkit.serve.prompts import (
    chat_prompt_ids,
    check_token_ids,
    completion_prompts,
    image_token_id,
)
from vfkit.serve.protocol import (
    ChatRequest,
    CompletionRequest,
    LoadLoraRequest,
    UnloadLoraRequest,
    sampling_params,
)
from vfkit.serve.responses import TokenText, chat_response, completion_response
from vfkit.serve.sequence import SamplingParams, Sequence, abort_unfinished
from vfkit.serve.streaming import start_stream
from vfkit.serve.token_route import GenerateRequest, generate_response, sampling_request
from vfkit.serve.vision import MediaPolicy, VisionInputs, vision_prompt

_DISCONNECT_POLL_S = 1.0
logger = logging.getLogger(__name__)


class Server:
    """Glue between requests and the engine: model names, prompts, waiting for sequences."""

    def __init__(self, engine: Engine, config: ServeConfig) -> None:
        self.engine = engine
        self.config = config
        self.tokenizer = engine.tokenizer
        self.tokens = TokenText(self.tokenizer)
        self.created = int(time.time())
        self._loading: set[str] = set()  # adapter names whose load is under way

    def base_names(self) -> set[str]:
        """Every `model` value that means the base model."""
        return {"", self.config.model_id, self.config.model, self.engine.model_path}

    def check_adapter_name(self, name: str) -> None:
        """400 when an adapter name would shadow the base model (requests could not reach it)."""
        if name in self.base_names():
            raise APIError(
                400,
                f"lora_name '{name}' is the base model's name; choose another lora_name.",
                param="lora_name",
            )

    @contextlib.contextmanager
    def loading(self, name: str, inplace: bool) -> Iterator[None]:
        """Hold `name` while its load runs: a second load of it (not in place) is a 400, as
        once it is loaded (before, concurrent loads of one name all answered "Success")."""
        if name in self._loading and not inplace:
            raise APIError(
                400, f"The lora adapter '{name}' is being loaded by another request. Pass "
                "load_inplace=true to replace its weights.", param="lora_name",
            )
        self._loading.add(name)
        try:
            yield
        finally:
            self._loading.discard(name)

    def check_stop_ids(self, ids: list[int] | None, field: str) -> None:
        """400 naming a stop token id that is not a token of the model (it could never stop)."""
        check_token_ids(ids or [], len(self.tokenizer), None, field=field)

    def adapter_for(self, model: str | None) -> str | None:
        """None for the base model; the adapter name for a loaded adapter; else 404."""
        if model is None or model in self.base_names():
            return None
        if self.engine.lora.has(model):
            return model
        raise APIError(
            404, f"The model `{model}` does not exist.", param="model", code="model_not_found"
        )

    async def chat_prompt(self, req: ChatRequest) -> tuple[list[int], VisionInputs | None]:
        """The prompt's token ids (and an image prompt's vision inputs), off the event loop."""
        trust = self.config.trust_request_chat_template
        max_len = self.engine.max_model_len
        processor = getattr(self.engine, "processor", None)
        if processor is not None:
            policy = MediaPolicy(
                tuple(filter(None, [self.config.allowed_local_media_path])),
                self.config.max_images,
            )
            return await asyncio.to_thread(
                vision_prompt, processor, req, max_len, trust_templates=trust, policy=policy
            )
        # the scripted test server has no model: it ignores images instead of refusing them
        images = getattr(self.engine, "image_parts", "refuse")
        ids = await asyncio.to_thread(
            chat_prompt_ids, self.tokenizer, req, max_len, trust_templates=trust, images=images
        )
        return ids, None

    def submit(
        self,
        prompts: list[tuple[list[int], SamplingParams]],
        n: int,
        adapter: str | None,
        on_token: Callable[..., None] | None = None,
        vision: VisionInputs | None = None,
    ) -> tuple[list[list[Sequence]], list[asyncio.Future]]:
        """Queue n sequences per (prompt, params); each future resolves when its one is done.
        `vision`: the image inputs of a (single) chat prompt."""
        if not self.engine.alive:
            raise APIError(503, "The generation worker is not running; see the server log.")
        loop = asyncio.get_running_loop()
        groups, futures = [], []
        for ids, params in prompts:
            group = []
            for j in range(n):
                future = loop.create_future()
                futures.append(future)
                group.append(
                    Sequence(
                        ids,
                        params,
                        adapter,
                        on_done=partial(_resolve_soon, loop, future),
                        on_token=on_token,
                        generator=self.engine.generator(params.seed, j),
                        vision=vision,
                    )
                )
            groups.append(group)
        self.engine.submit([s for g in groups for s in g])
        return groups, futures

    async def generate(
        self,
        request: Request,
        prompts: list[tuple[list[int], SamplingParams]],
        n: int,
        adapter: str | None,
        vision: VisionInputs | None = None,
    ) -> list[list[Sequence]]:
        """Run n sequences per (prompt, params) to completion; abort if the client goes away."""
        groups, futures = self.submit(prompts, n, adapter, vision=vision)
        seqs = [s for g in groups for s in g]
        try:
            await _wait_unless_disconnected(asyncio.gather(*futures), request)
        finally:
            abort_unfinished(seqs)
        errors = [s.error for s in seqs if s.error is not None]
        if errors:
            raise APIError(500, f"Generation failed: {errors[0]!r}")
        return groups

    def models(self) -> dict[str, Any]:
        base = self.config.model_id
        card = {"object": "model", "created": self.created, "owned_by": "vfkit"}
        data = [
            {
                **card,
                "id": base,
                "root": self.engine.model_path,
                "parent": None,
                "max_model_len": self.engine.max_model_len,
            }
        ]
        prints = self.engine.lora.fingerprints()
        for name, path in self.engine.lora.paths().items():
            data.append(
                {**card, "id": name, "root": str(path), "parent": base,
                 "fingerprint": prints.get(name)}
            )  # fmt: skip
        return {"object": "list", "data": data}


def _resolve_soon(loop: asyncio.AbstractEventLoop, future: asyncio.Future, seq: Sequence) -> None:
    """Called on the engine thread: hand the finished sequence to the event loop."""

    def resolve() -> None:
        if not future.done():
            future.set_result(seq)

    loop.call_soon_threadsafe(resolve)


async def _wait_unless_disconnected(pending: asyncio.Future, request: Request) -> Any:
    while True:
        done, _ = await asyncio.wait({pending}, timeout=_DISCONNECT_POLL_S)
        if done:
            return pending.result()
        if await request.is_disconnected():
            pending.cancel()
            pending.add_done_callback(_consume)
            raise APIError(400, "The client disconnected.")


def _consume(future: asyncio.Future) -> None:
    """Retrieve a dropped future's outcome so asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()


def create_app(engine: Engine, config: ServeConfig) -> FastAPI:
    """The FastAPI app; routes are vLLM's so that clients do not care which server runs
    (the OpenAI ones, vLLM's adapter loading and its token-in `/inference/v1/generate`)."""
    app = FastAPI(title="vfkit embedded server", docs_url=None, redoc_url=None)
    server = Server(engine, config)
    app.state.server = server
    _install_errors_and_auth(app, config.api_key)
    app.add_middleware(BodyLimit, max_bytes=config.max_request_bytes)

    @app.get("/health")
    async def health() -> JSONResponse:
        if not engine.alive:
            raise APIError(503, "The generation worker is not running; see the server log.")
        return JSONResponse({"status": "ok", **engine.load()})

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        """Engine counters (not part of the OpenAI protocol): where the time goes."""
        paths = {f"forwards_{k}": v for k, v in engine.lora.path_counts.items()}
        graphs = {"graph_error": engine.decoder.error} if engine.decoder is not None else {}
        return {**dataclasses.asdict(engine.stats), **engine.load(), **paths, **graphs}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return server.models()

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request) -> Any:
        refuse_unsupported(req.model_extra or {})
        adapter = server.adapter_for(req.model)
        prompt_ids, vision = await server.chat_prompt(req)
        server.check_stop_ids(req.stop_token_ids, "stop_token_ids")
        params = sampling_params(req, len(prompt_ids), engine.max_model_len)
        model = req.model or config.model_id
        if req.stream:
            return start_stream(server, req, model, [(prompt_ids, params)], adapter, vision)
        (seqs,) = await server.generate(request, [(prompt_ids, params)], req.n, adapter, vision)
        return await asyncio.to_thread(chat_response, req, model, prompt_ids, seqs, server.tokens)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request) -> Any:
        refuse_unsupported(req.model_extra or {})
        if req.echo:
            raise APIError(400, "echo=true is not supported by the embedded server.", param="echo")
        adapter = server.adapter_for(req.model)
        server.check_stop_ids(req.stop_token_ids, "stop_token_ids")
        prompts = await asyncio.to_thread(
            completion_prompts, req, server.tokenizer, engine.max_model_len,
            image_token_id(engine),
        )
        jobs = [(p, sampling_params(req, len(p), engine.max_model_len)) for p in prompts]
        model = req.model or config.model_id
        if req.stream:
            return start_stream(server, req, model, jobs, adapter)
        groups = await server.generate(request, jobs, req.n, adapter)
        return await asyncio.to_thread(
            completion_response, req, model, prompts, groups, server.tokens
        )

    @app.post("/inference/v1/generate")
    async def generate(req: GenerateRequest, request: Request) -> dict[str, Any]:
        """vLLM's token-in route (prime-rl's train client): token ids in, token ids out."""
        sampling = sampling_request(req)
        adapter = server.adapter_for(req.model)
        check_token_ids(req.token_ids, len(server.tokenizer), image_token_id(engine))
        server.check_stop_ids(sampling.stop_token_ids, "sampling_params.stop_token_ids")
        params = sampling_params(
            sampling, len(req.token_ids), engine.max_model_len, prompt_field="token_ids"
        )
        (seqs,) = await server.generate(request, [(req.token_ids, params)], sampling.n, adapter)
        return generate_response(req.token_ids, seqs, server.tokens)

    @app.post("/v1/load_lora_adapter")
    async def load_lora(req: LoadLoraRequest) -> JSONResponse:
        """vLLM answers plain text; a JSON body that says "Success" also carries the fingerprint
        of the weights read, which the trainer compares with its own (vfkit.lora_fingerprint)."""
        server.check_adapter_name(req.lora_name)
        with server.loading(req.lora_name, req.load_inplace):
            files = await asyncio.to_thread(
                engine.lora.check_load, req.lora_name, req.lora_path, req.load_inplace
            )
            future = engine.call(partial(engine.lora.apply_load, req.lora_name, files))
            try:
                await asyncio.wrap_future(future)
            except APIError:
                raise
            except Exception as exc:
                reason = str(exc) if len(str(exc)) <= 500 else str(exc)[:500] + " ..."
                raise APIError(
                    400, f"Loading adapter '{req.lora_name}' from {files.path} failed: {reason}",
                    param="lora_path",
                ) from exc
        message = f"Success: LoRA adapter '{req.lora_name}' added successfully."
        return JSONResponse(
            {"message": message, "lora_name": req.lora_name, "fingerprint": files.fingerprint}
        )

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(req: UnloadLoraRequest) -> PlainTextResponse:
        engine.lora.begin_unload(req.lora_name)  # 404 for it from now on
        # freed once no sequence uses it, which may be long after this answer
        done = engine.call(partial(engine.lora.apply_unload, req.lora_name),
                           unused_adapter=req.lora_name)
        done.add_done_callback(partial(_log_failure, f"freeing adapter '{req.lora_name}'"))
        return PlainTextResponse(f"Success: LoRA adapter '{req.lora_name}' removed successfully.")

    return app


def _log_failure(what: str, future: Future) -> None:
    """A deferred operation's error goes to the server log (nobody awaits its future)."""
    if future.exception() is not None:
        logger.error("%s failed", what, exc_info=future.exception())


def _install_errors_and_auth(app: FastAPI, api_key: str | None) -> None:
    """Every error leaves as an OpenAI error body; with a key, every route needs it."""

    def reply(error: APIError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return reply(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return reply(validation_error(list(exc.errors())))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return reply(APIError(exc.status_code, str(exc.detail)))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        return reply(APIError(500, f"Internal error: {exc!r}"))

    if not api_key:
        return
    expected = f"Bearer {api_key}".encode()

    @app.middleware("http")
    async def require_key(request: Request, call_next):
        given = request.headers.get("authorization", "").encode()
        if not secrets.compare_digest(given, expected):
            return reply(APIError(401, "Invalid or missing API key.", code="invalid_api_key"))
        return await call_next(request)
