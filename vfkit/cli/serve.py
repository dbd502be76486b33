"""`vf-serve MODEL` (or `--model MODEL`): the embedded OpenAI-compatible server, in the foreground.

vf-serve HuggingFaceTB/SmolLM2-135M-Instruct --port 8000 --allowed-adapter-dir outputs/
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

from vfkit.cli import quiet_dependency_warnings
from vfkit.errors import VfkitError
from vfkit.serve.config import (
    CUDA_GRAPHS,
    DEFAULT_IMAGES_PER_PROMPT,
    DTYPES,
    LOG_LEVELS,
    ServeConfig,
    parse_mm_limits,
)
from vfkit.serve.limits import DEFAULT_MAX_REQUEST_BYTES


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vf-serve",
        description="Serve a model over vLLM's OpenAI-compatible protocol, with runtime LoRA.",
    )
    p.add_argument("model", nargs="?", help="HF model id or local folder")
    p.add_argument(
        "--model", dest="model_flag", metavar="MODEL", help="the same as MODEL (vLLM accepts both)"
    )
    p.add_argument("--served-model-name", help="model id clients send (default: MODEL)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key",
        default=os.environ.get("VFKIT_API_KEY"),
        help="require 'Authorization: Bearer KEY' on every route (default: $VFKIT_API_KEY)",
    )
    p.add_argument(
        "--allowed-adapter-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="adapters may be loaded from below DIR (repeatable); none: adapter loading refused",
    )
    p.add_argument("--max-lora-rank", type=int, default=64)
    p.add_argument("--max-loras", type=int, default=4, help="distinct adapters per batch")
    p.add_argument(
        "--enable-lora", action="store_true", help="accepted for vLLM parity (always on)"
    )
    p.add_argument("--dtype", default="auto", choices=DTYPES)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    p.add_argument("--max-model-len", type=int, help="context length (default: the model's)")
    p.add_argument("--max-num-seqs", type=int, default=32, help="sequences decoded together")
    p.add_argument("--max-queue", type=int, default=256, help="waiting sequences before 429")
    p.add_argument("--max-prefill-tokens", type=int, default=4096)
    p.add_argument("--threads", type=int, help="torch threads (default: all cores)")
    p.add_argument(
        "--cuda-graphs", default="off", choices=CUDA_GRAPHS,
        help="replay decode steps as CUDA graphs (auto: on a CUDA device for text models); "
        "experimental, see benchmarks/RESULTS.md",
    )
    p.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="render a request's own chat_template (jinja sandbox, time-bounded); default: 400",
    )
    p.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        help="larger request bodies get HTTP 413 (default: 10 MiB)",
    )
    p.add_argument(
        "--allowed-local-media-path",
        metavar="DIR",
        help="image models: images may be read from local files below DIR (file:// URLs or "
        "paths); default: none (data URLs only)",
    )
    p.add_argument(
        "--limit-mm-per-prompt",
        type=_mm_limits,
        default={"image": DEFAULT_IMAGES_PER_PROMPT},
        metavar="JSON",
        help=f"image models: most images one prompt may carry, as vLLM's JSON "
        f"'{{\"image\": N}}' (default: {DEFAULT_IMAGES_PER_PROMPT})",
    )
    p.add_argument("--log-level", default="info", type=str.lower, choices=LOG_LEVELS)
    return p


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    """The config the flags describe; ValueError naming the flag for a value that cannot work."""
    if args.model and args.model_flag and args.model != args.model_flag:
        raise ValueError(f"two models given: {args.model!r} and --model {args.model_flag!r}")
    model = args.model or args.model_flag
    if not model:
        raise ValueError("no model given: vf-serve MODEL or vf-serve --model MODEL")
    return ServeConfig(
        model=model,
        served_model_name=args.served_model_name,
        host=args.host,
        port=args.port,
        api_key=args.api_key or None,
        allowed_adapter_dirs=tuple(args.allowed_adapter_dir),
        max_lora_rank=args.max_lora_rank,
        max_loras=args.max_loras,
        dtype=args.dtype,
        device=args.device,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_queue=args.max_queue,
        max_prefill_tokens=args.max_prefill_tokens,
        threads=args.threads,
        cuda_graphs=args.cuda_graphs,
        trust_request_chat_template=args.trust_request_chat_template,
        max_request_bytes=args.max_request_bytes,
        log_level=args.log_level,
        allowed_local_media_path=args.allowed_local_media_path,
        limit_mm_per_prompt=args.limit_mm_per_prompt,
    )


def _mm_limits(text: str) -> dict[str, int]:
    try:
        return parse_mm_limits(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))  # usage + "vf-serve: error: --max-num-seqs must be ...", exit 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    _exit_with_parent()
    quiet_dependency_warnings()
    from vfkit.serve.runner import serve_forever

    try:
        serve_forever(config)
    except (VfkitError, ValueError, OSError) as exc:
        print(f"vf-serve: error: {exc}", file=sys.stderr)
        return 1
    return 0


def _exit_with_parent() -> None:
    """When started by the launcher, stop (SIGTERM self) once the launching process is gone."""
    parent = os.environ.pop("VFKIT_EXIT_WITH_PARENT", "")
    if not parent.isdigit():
        return

    def watch() -> None:
        while os.getppid() == int(parent):  # reparented once the launcher is gone
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="vfkit-parent-watch", daemon=True).start()


if __name__ == "__main__":
    raise SystemExit(main())
