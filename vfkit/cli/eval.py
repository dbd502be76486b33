"""`vf-eval ENV_ID [flags]`: evaluate an environment against any OpenAI-compatible model.

    vf-eval reverse-text -m HuggingFaceTB/SmolLM2-135M-Instruct -n 20 -r 4 -s
    vf-eval gsm8k -m gpt-4.1-mini -b https://api.openai.com/v1 -k OPENAI_API_KEY -s
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import traceback
from pathlib import Path

from rich.console import Console
from rich.logging import RichHandler
from rich.text import Text

from vfkit.errors import VfkitError
from vfkit.evaluation.config import (
    DEFAULT_API_KEY_VAR,
    DEFAULT_MODEL,
    DEFAULT_OUTPUT_DIR,
    EvalConfig,
    build_sampling_args,
    parse_headers,
    parse_json_object,
    parse_state_columns,
)
from vfkit.evaluation.terminal import RewriteLogs, printable
from vfkit.evaluation.urls import redact_text


def build_parser() -> argparse.ArgumentParser:
    """The flags of classic verifiers' vf-eval, plus --resume."""
    p = argparse.ArgumentParser(
        prog="vf-eval", description="Evaluate an environment against an OpenAI-compatible model."
    )
    p.add_argument("env_id", nargs="?", help="environment id, e.g. reverse-text")
    p.add_argument("-a", "--env-args", help="JSON object passed to load_environment")
    p.add_argument("-m", "--model", help=f"model or endpoint-registry id (default {DEFAULT_MODEL})")
    p.add_argument("-b", "--api-base-url", help="base URL of an OpenAI-compatible server")
    p.add_argument("-k", "--api-key-var",
                   help=f"env var holding the key ({DEFAULT_API_KEY_VAR} for api.openai.com)")
    p.add_argument("--header", action="append", help="extra HTTP header 'Name: Value' (repeatable)")
    p.add_argument("-e", "--endpoints", type=Path, help="endpoint registry TOML ([[endpoint]])")
    p.add_argument("-n", "--num-examples", type=int, help="examples to evaluate (-1: all)")
    p.add_argument("-r", "--rollouts-per-example", type=int, help="rollouts per example")
    p.add_argument("-c", "--max-concurrent", type=int, default=32, help="concurrent rollouts")
    p.add_argument("-t", "--max-tokens", type=int, help="max tokens per model call")
    p.add_argument("-T", "--temperature", type=float, help="sampling temperature")
    p.add_argument("-S", "--sampling-args", help="JSON object of sampling args (wins over -t/-T)")
    p.add_argument("-C", "--state-columns", action="append", help="extra state keys to save")
    p.add_argument("-s", "--save-results", action="store_true", help="save results to disk")
    p.add_argument("-f", "--save-every", type=int, default=1, help="write every N rollouts")
    p.add_argument("-o", "--output-dir", type=Path, help=f"base folder ({DEFAULT_OUTPUT_DIR})")
    p.add_argument("--resume", type=Path, help="continue the interrupted run in this folder")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per model request")
    p.add_argument("--max-retries", type=int, default=3, help="retries per model request")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logs and tracebacks")
    for flag in CLASSIC_ONLY:  # newer verifiers' flags: a pointer, not "unrecognized"
        p.add_argument(*flag.split("/"), dest=f"classic_{flag}", nargs="?", const=True,
                       help=argparse.SUPPRESS)
    return p


# flags of verifiers' own vf-eval that vfkit's does not take -> what to do instead
CLASSIC_ONLY = {
    "-p/--env-dir-path": "vfkit loads installed environments: vf-install ./my-env (or put its "
    "folder on PYTHONPATH)",
    "--max-concurrent-generation": "drop it (verifiers ignores it too); -c bounds rollouts",
    "--max-concurrent-scoring": "drop it (verifiers ignores it too); -c bounds rollouts",
    "--header-file": "give each header with --header 'Name: Value'",
    "--http-max-retries": "use --max-retries",
}


def classic_flag_error(args: argparse.Namespace) -> str | None:
    """The first verifiers-only flag given, named with what to use in vfkit."""
    for flag, instead in CLASSIC_ONLY.items():
        if getattr(args, f"classic_{flag}", None) is not None:
            return f"{flag} is a flag of verifiers' vf-eval, not vfkit's: {instead}"
    return None


def config_from_args(args: argparse.Namespace) -> EvalConfig:
    """Turn parsed flags into an EvalConfig; JSON and header errors name their flag."""
    return EvalConfig(
        env_id=args.env_id,
        env_args=parse_json_object(args.env_args, "-a/--env-args"),
        model=args.model,
        api_base_url=args.api_base_url,
        api_key_var=args.api_key_var,
        headers=parse_headers(args.header),
        endpoints_path=args.endpoints,
        num_examples=args.num_examples,
        rollouts_per_example=args.rollouts_per_example,
        max_concurrent=args.max_concurrent,
        sampling_args=build_sampling_args(args.max_tokens, args.temperature, args.sampling_args),
        state_columns=parse_state_columns(args.state_columns),
        # -o and --resume only make sense when saving, so they imply -s
        save_results=bool(args.save_results or args.output_dir or args.resume),
        save_every=args.save_every,
        output_dir=args.output_dir or DEFAULT_OUTPUT_DIR,
        resume=args.resume,
        timeout=args.timeout,
        max_retries=args.max_retries,
        verbose=args.verbose,
    )


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, so the embedded server is stopped and results flushed."""
    raise KeyboardInterrupt


def _print_traceback(err: Console, exc: BaseException) -> None:
    """The traceback for -v, with URL passwords redacted like every other line vf-eval prints."""
    text = "".join(traceback.format_exception(exc))
    err.print(redact_text(text), markup=False, highlight=False)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `vf-eval`; returns the exit code (0 ok, 1 error, 130 interrupted)."""
    args = build_parser().parse_args(argv)
    err = Console(stderr=True, soft_wrap=True)  # errors stay on one line, greppable
    if why := classic_flag_error(args):
        err.print(f"vf-eval: error: {why}", markup=False, highlight=False)
        return 1
    # log lines go through the same console, above the live progress bar
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(name)s: %(message)s",
        handlers=[RichHandler(console=err, show_time=False, show_path=False)],
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(RewriteLogs(redact_text))  # a password in -b never reaches the terminal
        handler.addFilter(RewriteLogs(printable))  # nor a model's escape codes, quoted in an error
    if args.verbose:
        logging.getLogger("vfkit").setLevel(logging.DEBUG)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        from vfkit.evaluation.runner import run_eval

        run_eval(config_from_args(args), console=err)
    except VfkitError as exc:
        if args.verbose:
            _print_traceback(err, exc)
        err.print(Text.assemble(("error: ", "bold red"), printable(redact_text(str(exc)))))
        return 1
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        return 130
    except Exception as exc:
        if args.verbose:
            _print_traceback(err, exc)
        else:
            message = redact_text(f"{type(exc).__name__}: {exc} (run with -v for the traceback)")
            err.print(Text.assemble(("error: ", "bold red"), printable(message)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
