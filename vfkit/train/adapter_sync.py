"""Hot-load trained adapters into the inference server and check that they landed.

vLLM's runtime-LoRA routes (the embedded server and TestServer speak them too):
POST /v1/load_lora_adapter, POST /v1/unload_lora_adapter, loaded names listed by GET /v1/models.
A load is trusted when the server reports the fingerprint of exactly the weights the trainer
saved (vf-serve does), or else lists the adapter and, when asked, a probe completion's logprobs
under it match the trainer's own (so a stale or wrongly scaled adapter cannot pass).
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

from vfkit.errors import AdapterSyncError

logger = logging.getLogger(__name__)

# the HTTP stack the openai client is built on: httpx2 since openai 3, httpx before (same API)
if int(openai.__version__.split(".")[0]) >= 3:
    import httpx2 as openai_http
else:
    openai_http = httpx

PROBE_MESSAGES = [{"role": "user", "content": "Write one short sentence about the sea."}]
PROBE_TOKENS = 32  # enough tokens that one outlier cannot decide (the check uses the median)


@dataclass
class Probe:
    """A completion sampled by the server under an adapter, with the server's logprobs."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]


def _hint(status: int) -> str:
    if status == 403:
        return " (the server does not allow this folder: start it with --allowed-adapter-dir)"
    if status == 404:
        return (
            " (no runtime LoRA route: vLLM needs --enable-lora and"
            " VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"
        )
    return ""


def backoff_delays(budget: float, first: float = 0.5, cap: float = 5.0) -> list[float]:
    """Waits between retries (doubling up to `cap`) whose sum stays within `budget` seconds."""
    delays, delay = [], first
    while sum(delays) + delay <= budget:
        delays.append(delay)
        delay = min(delay * 2, cap)
    return delays


class AdapterSync:
    """Talks to the server's LoRA routes: load, list, probe, unload; re-loads lost adapters.

    Connection errors and 5xx answers are retried with backoff for up to `retry_for` seconds
    (default: `timeout`), so a server that restarts mid-sync does not end the run.
    """

    def __init__(
        self, base_url: str, api_key: str = "", timeout: float = 120.0,
        retry_for: float | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout)
        self.retry_for = timeout if retry_for is None else retry_for
        self.known: dict[str, Path] = {}  # adapters we loaded: name -> folder (for re-loads)
        self._reload_lock = asyncio.Lock()

    async def _request(self, method: str, route: str, body: dict | None = None) -> httpx.Response:
        """One request, retried on connection errors and 5xx until `retry_for` runs out."""
        delays = backoff_delays(self.retry_for)
        deadline = time.monotonic() + self.retry_for
        for attempt in range(len(delays) + 1):
            try:
                response = await self.http.request(method, route, json=body)
                if response.status_code < 500:
                    return response
                problem = f"HTTP {response.status_code} {response.text[:200]}"
            except httpx.TransportError as exc:
                problem = repr(exc)
            if attempt == len(delays) or time.monotonic() + delays[attempt] > deadline:
                break
            logger.warning(
                "server %s unreachable (%s), retrying (%d/%d) in %.1f s",
                self.base_url, problem, attempt + 1, len(delays), delays[attempt],
            )
            await asyncio.sleep(delays[attempt])
        what = "kept failing" if problem.startswith("HTTP") else "could not be reached"
        raise AdapterSyncError(
            f"could not reach {self.base_url}{route}: it {what} for {self.retry_for:.0f} s"
            f" ({problem}); is the server running? Check its log, restart it (vf-rl does this"
            " itself) and resume with `vf-train CONFIG --resume`, or raise"
            " trainer.args.sync_timeout to wait longer"
        )

    async def _post(self, route: str, body: dict) -> httpx.Response:
        return await self._request("POST", route, body)

    async def served_models(self) -> list[dict]:
        """GET /v1/models: the base model and every loaded adapter."""
        response = await self._request("GET", "/models")
        response.raise_for_status()
        return response.json()["data"]

    async def load(self, name: str, path: Path) -> dict:
        """Load (or replace) adapter `name` from `path`; return the server's /v1/models card.

        The card carries the server's `fingerprint` of the weights it read, when it has one
        (vfkit's server does; vLLM does not).
        """
        body = {"lora_name": name, "lora_path": str(Path(path).resolve()), "load_inplace": True}
        response = await self._post("/load_lora_adapter", body)
        if response.status_code != 200:
            raise AdapterSyncError(
                f"the server at {self.base_url} refused adapter {name} from {path}:"
                f" HTTP {response.status_code} {response.text[:300]}{_hint(response.status_code)}"
            )
        cards = {m["id"]: m for m in await self.served_models()}
        if name not in cards:
            raise AdapterSyncError(
                f"the server accepted adapter {name} but does not list it in /v1/models"
                f" (listed: {sorted(cards)}); rollouts would use a stale policy"
            )
        self.known[name] = Path(path)
        return cards[name]

    async def reload(self, name: str) -> bool:
        """Load `name` again if we loaded it before and the server lost it; False if not ours."""
        if name not in self.known:
            return False
        async with self._reload_lock:  # many requests 404 at once: one re-load serves them all
            if name not in {m["id"] for m in await self.served_models()}:
                logger.warning(
                    "the server %s lost adapter %s (restarted?); loading it again from %s",
                    self.base_url, name, self.known[name],
                )
                await self.load(name, self.known[name])
        return True

    async def unload(self, name: str) -> None:
        """Unload an adapter no batch uses any more (a missing one is fine)."""
        self.known.pop(name, None)
        response = await self._post("/unload_lora_adapter", {"lora_name": name})
        if response.status_code not in (200, 404):
            raise AdapterSyncError(
                f"unloading adapter {name} failed: HTTP {response.status_code}"
                f" {response.text[:300]}"
            )

    async def probe(self, model: str, max_tokens: int = PROBE_TOKENS, seed: int = 0) -> Probe:
        """Sample a short completion under `model` at temperature 1, with token ids + logprobs."""
        body = {
            "model": model, "messages": PROBE_MESSAGES, "max_tokens": max_tokens,
            "temperature": 1.0, "logprobs": True, "seed": seed, "return_token_ids": True,
        }
        response = await self._post("/chat/completions", body)
        if response.status_code == 404 and await self.reload(model):
            response = await self._post("/chat/completions", body)
        if response.status_code != 200:
            raise AdapterSyncError(
                f"probe request to adapter {model} failed: HTTP {response.status_code}"
                f" {response.text[:300]}"
            )
        data = response.json()
        choice = data["choices"][0]
        logprobs = [entry["logprob"] for entry in choice["logprobs"]["content"]]
        return Probe(data["prompt_token_ids"], choice["token_ids"], logprobs)

    def transport(self) -> openai_http.AsyncBaseTransport:
        """An httpx transport for the generation client that re-loads lost adapters on 404."""
        return ReloadingTransport(self)

    async def aclose(self) -> None:
        await self.http.aclose()


class ReloadingTransport(openai_http.AsyncBaseTransport):
    """Generation requests whose adapter the server lost (404) re-load it and are sent again."""

    def __init__(self, sync: AdapterSync) -> None:
        # the openai client's own pool size (a transport given to it replaces its default one)
        limits = openai_http.Limits(max_connections=1000, max_keepalive_connections=100)
        self.sync, self.inner = sync, openai_http.AsyncHTTPTransport(limits=limits)

    async def handle_async_request(self, request: openai_http.Request) -> openai_http.Response:
        response = await self.inner.handle_async_request(request)
        if response.status_code != 404 or request.method != "POST":
            return response
        try:
            model = json.loads(request.content).get("model")
        except (ValueError, AttributeError):
            return response
        if not isinstance(model, str) or not await self.sync.reload(model):
            return response
        await response.aclose()
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def check_fingerprint(name: str, served: str, trained: str) -> None:
    """AdapterSyncError unless the server's fingerprint of `name` is the trained adapter's."""
    if served != trained:
        raise AdapterSyncError(
            f"adapter {name} did not land as trained: the server holds weights with fingerprint"
            f" {served[:19]}…, the trainer saved {trained[:19]}… (a stale or different adapter"
            " file was loaded); check that trainer and server see the same outputs folder"
        )


def probe_diff(probe: Probe, trainer_logprobs: list[float]) -> float:
    """Median |server - trainer| logprob over the probe's tokens (0 for an empty probe).

    The median, not the mean: bf16 servers differ from the fp32 trainer by a few hundredths
    on most tokens and by much more on a rare one, which must not decide alone.
    """
    diffs = sorted(abs(a - b) for a, b in zip(probe.logprobs, trainer_logprobs, strict=True))
    return statistics.median(diffs) if diffs else 0.0


def check_probe(name: str, probe: Probe, trainer_logprobs: list[float], tolerance: float) -> float:
    """The probe's `probe_diff`; AdapterSyncError when it is above tolerance."""
    diff = probe_diff(probe, trainer_logprobs)
    if diff > tolerance:
        raise AdapterSyncError(
            f"adapter {name} did not land as trained: server and trainer logprobs differ by"
            f" {diff:.4f} (median over {len(probe.logprobs)} probe tokens, tolerance"
            f" {tolerance}) on every re-check; the server may serve a stale or differently"
            " scaled adapter. Raise trainer.args.adapter_probe_tolerance if the server runs in"
            " lower precision."
        )
    return diff
