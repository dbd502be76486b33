"""The run config: one typed tree read from one TOML file (`vf-train configs/exp.toml`).

Top-level shape follows classic verifiers' `vf-rl` TOML so its users feel at home:

    model = "HuggingFaceTB/SmolLM2-135M-Instruct"
    [env]            id = "reverse-text"; [env.args] -> load_environment kwargs
    [inference]      backend, host, port, gpus, base_url; [inference.args] -> server flags
    [trainer]        gpus; [trainer.args] -> `TrainerArgs`

Unknown keys are rejected and every field is read somewhere (tests/test_train_keys*.py show
what each one changes). Load with `vfkit.train.config_loader.load_config`.
"""

from __future__ import annotations

import math
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

from vfkit.client.sampling import merge_sampling_args
from vfkit.train.config_fields import (
    REDACTED,
    check_base_url,
    check_folder_name,
    check_gpus,
    check_server_args,
    not_blank,
)
from vfkit.types import SamplingArgs

LossType = Literal["grpo", "dr_grpo", "dapo", "cispo"]
SchedulerName = Literal[
    "constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts", "polynomial"
]
ReportTarget = Literal["jsonl", "wandb", "tensorboard"]
Gpus = int | list[int] | Literal["auto"]


class Section(BaseModel):
    """Base for every config table: unknown keys are errors; field docstrings are descriptions."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        use_attribute_docstrings=True,
        validate_default=True,
        allow_inf_nan=False,  # `learning_rate = inf` is a mistake, not a setting
    )


class EnvConfig(Section):
    """[env]: the environment trained on, and the one evaluated on."""

    id: str
    """Environment id, as given to `load_environment` (e.g. "reverse-text")."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for the environment's `load_environment`."""
    eval_id: str | None = None
    """Environment id used for evaluation; default: the training environment."""
    eval_args: dict[str, Any] | None = None
    """`load_environment` kwargs for the eval environment; default: `args`."""

    @field_validator("id", "eval_id")
    @classmethod
    def _id_not_blank(cls, value: str | None) -> str | None:
        return not_blank(value, "an environment id, e.g. \"reverse-text\"")


class InferenceConfig(Section):
    """[inference]: the server rollouts use: one started here, or `base_url`."""

    backend: Literal["auto", "builtin", "vllm"] = "auto"
    """Server started when base_url is empty; auto = vLLM when CUDA and vllm exist, else builtin."""
    host: str = "127.0.0.1"
    """Interface the started server binds."""
    port: int = Field(0, ge=0, le=65535)
    """Port of the started server; 0 picks a free one."""
    gpus: Gpus = "auto"
    """GPUs for the started server: "auto" (the first GPU when one is visible, else the CPU),
    a count, or device ids (among those visible to vf-rl / vf-train); 0 = the CPU."""
    base_url: str = ""
    """Use an already-running OpenAI-compatible server (e.g. http://host:8000/v1) instead."""
    api_key: str = ""
    """API key for the server (the started one requires it; sent as Bearer token)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Extra server options (max_lora_rank, dtype, ... or any `--flag` of the backend)."""

    @field_validator("gpus")
    @classmethod
    def _gpus_not_negative(cls, value: Gpus) -> Gpus:
        return check_gpus(value)

    @field_validator("host")
    @classmethod
    def _host_not_blank(cls, value: str) -> str:
        return not_blank(value, "an interface, e.g. \"127.0.0.1\"")

    @field_validator("base_url")
    @classmethod
    def _base_url_is_http(cls, value: str) -> str:
        return check_base_url(value)

    @field_validator("args")
    @classmethod
    def _server_args_valid(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_server_args(value)

    @field_serializer("api_key", when_used="json")
    def _redact_api_key(self, value: str) -> str:
        """JSON dumps go to wandb, tensorboard and printed plans: never the key itself."""
        return REDACTED if value else ""


SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def machine_async_level() -> int:
    """The default policy lag: 1 where the next batch can generate while this one trains, else 0.

    With a GPU, or two or more CPU cores to split between a local server and the trainer, the
    overlap hides the generation time (measured on a 2-core CPU, SmolLM2 on exp.toml: 3.8-4.7 s
    of a 6-8 s step, benchmarks/RESULTS.md). On one core and no GPU the two would only take
    turns on that core: no step gets faster, and every batch would come from a policy one step
    older. (A server on another machine overlaps anyway: set `async_level = 1` for it.)
    """
    usable = getattr(os, "sched_getaffinity", None)  # Linux; macOS and Windows lack it
    if (len(usable(0)) if usable else os.cpu_count() or 1) >= 2:
        return 1
    import torch  # only on a one-core machine: a config load should not pay for the import

    return 1 if torch.cuda.is_available() else 0


class TrainerArgs(Section):
    """[trainer.args]: rollouts, loss, optimizer, schedule, LoRA, checkpoints, logging."""

    # --- rollouts
    rollouts_per_example: int = Field(8, ge=2)
    """Completions sampled per prompt (one group); advantages are relative within the group."""
    batch_size: int = Field(32, ge=1)
    """Rollouts per optimizer step (batch_size / rollouts_per_example prompts)."""
    micro_batch_size: int = Field(8, ge=1)
    """Sequences per forward/backward pass; gradients accumulate to the whole batch."""
    max_steps: int = Field(100, ge=1)
    """Optimizer steps in the run."""
    max_seq_len: int = Field(1024, ge=8)
    """Longest trained sequence (prompt + completions); longer samples are dropped and counted."""
    max_prompt_len: int = Field(512, ge=1)
    """Dataset prompts longer than this many tokens are skipped (counted at start)."""
    max_tokens: int = Field(128, ge=1)
    """Tokens sampled per model call (per turn)."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature; the trainer divides its logits by it too."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass."""
    top_k: int = Field(-1, ge=-1)
    """Top-k sampling; -1 = off."""
    min_p: float = Field(0.0, ge=0, le=1)
    """Min-p sampling; 0 = off."""
    repetition_penalty: float = Field(1.0, gt=0)
    """Repetition penalty (1 = off)."""
    async_level: int = Field(default_factory=machine_async_level, ge=0, le=8)
    """Policy lag: batch k is sampled by the adapter of step k-1-async_level (0 = on-policy).
    Default: what this machine can overlap (`machine_async_level`)."""
    max_concurrent: int = Field(-1, ge=-1)
    """Rollouts in flight at once; -1 = the whole batch (0 is refused: nothing would run)."""
    generation_timeout: float = Field(600.0, gt=0)
    """Seconds one batch may take to generate before the run stops with an error."""
    # --- optimization
    learning_rate: float = Field(1e-5, gt=0, le=1)
    """AdamW learning rate."""
    lr_scheduler_type: SchedulerName = "constant"
    """Learning-rate schedule (transformers' get_scheduler names)."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up steps: step k of n at k/n of the learning rate (none at lr 0)."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    """AdamW beta1."""
    adam_beta2: float = Field(0.99, ge=0, lt=1)
    """AdamW beta2."""
    loraplus_lr_ratio: float = Field(1.0, ge=1, le=1024)
    """LoRA+ (arXiv:2402.12354, PEFT's helper): LoRA B learns at ratio x learning_rate; 1 = off.
    exp.toml sets 4; at its lr, 16 cut held-out reward (RESULTS.md, "LoRA+")."""
    max_grad_norm: float = Field(1.0, ge=0)
    """Gradient-norm clip; 0 = no clipping (the norm is still logged)."""
    bf16: bool | Literal["auto"] = "auto"
    """bf16 autocast for forward/backward (weights stay fp32). "auto": on where the device has
    bf16 units (CUDA, AVX512-BF16/AMX CPUs), off where it is emulated (vfkit/precision.py)."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""
    shared_prompt_forward: bool = True
    """Each prompt runs once a step, its keys/values shared by its completions (same gradients;
    off with gradient checkpointing or several trainer processes: update.py, policy.py)."""
    # --- LoRA
    use_lora: bool = True
    """Train a LoRA adapter (the only mode: adapters are what the server hot-loads)."""
    lora_rank: int = Field(16, ge=1)
    """LoRA rank r."""
    lora_alpha: float = Field(32.0, gt=0)
    """LoRA alpha (scale = alpha / r, or alpha / sqrt(r) with rslora)."""
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the LoRA input."""
    lora_target_modules: list[str] | Literal["all-linear"] = "all-linear"
    """Module names to adapt, or "all-linear"."""
    lora_use_rslora: bool = False
    """Rank-stabilized LoRA scaling."""
    lora_modules_to_save: list[str] = Field(default_factory=list)
    """Modules trained in full and saved with the adapter (the server must support them)."""
    lora_train_vision: bool = False
    """Vision-language models: LoRA targets also match the vision tower and projector (default:
    the language model only, vision frozen). Text models ignore it."""
    # --- loss
    loss_type: LossType = "grpo"
    """Policy-gradient loss: grpo | dr_grpo | dapo | cispo (vfkit/train/losses/)."""
    epsilon: float = Field(0.2, gt=0, le=1)
    """Lower clip range of the importance ratio (1 - epsilon, so at most 1)."""
    epsilon_high: float | None = Field(None, gt=0)
    """Upper clip range (1 + epsilon_high); default: epsilon."""
    ratio_against: Literal["sampler", "trainer"] = "trainer"
    """What the clipped ratio is taken against. "trainer" (the default; decoupled PPO, Hilton
    et al. 2021, arXiv:2110.00641): the trainer's own logprobs before this step's update, the
    async lag and sampler/trainer rounding corrected by a separate trainer/sampler importance
    weight (masked as below). One step per batch clips nothing, as in TRL's GRPOTrainer; with
    `num_iterations` > 1 the later steps clip from the policy that began the batch. "sampler":
    the server's logprobs, a trust region across the lag and the rounding: slower per step,
    steadier at high learning rates (benchmarks/RESULTS.md, "The decoupled ratio")."""
    num_iterations: int = Field(1, ge=1, le=16)
    """Optimizer steps on each batch (PPO's epochs; TRL's `num_iterations`). Steps after the
    first reuse the batch with the ratio clipped from the policy that began it: more learning
    per rollout, at one more training pass each. `max_steps`, the LR schedule and the
    adapters count batches."""
    mask_ratio_low: float = Field(0.125, ge=0)
    """Tokens whose trainer/sampler ratio is below this are masked out of the loss."""
    mask_ratio_high: float = Field(8.0, gt=0)
    """Tokens whose trainer/sampler ratio is above this are masked out of the loss."""
    beta: float = Field(0.0, ge=0)
    """KL-to-base coefficient (the base is the model with the adapter disabled)."""
    scale_rewards: Literal["group", "none"] = "group"
    """Divide advantages by the group's reward std ("group") or not ("none")."""
    filter_zero_advantage: bool = True
    """Drop groups whose advantages are all zero (they carry no gradient); counted."""
    dynamic_sampling_rounds: int = Field(0, ge=0, le=16)
    """Dynamic sampling (DAPO, Yu et al. 2025, arXiv:2503.14476): up to this many extra rounds
    per batch, each sampling fresh prompts in place of the groups that came back flat (every
    reward equal), so a step trains on up to batch_size rollouts with signal. Costs the extra
    generation (counted in groups/resampled); 0 = off. Needs filter_zero_advantage."""
    mask_truncated_completions: bool = False
    """Exclude completions cut at max_tokens/context from the loss (DAPO's overlong filter).
    It also drops the push-down on cut replies that earned nothing (RESULTS.md: "truncated
    completions left out of the loss")."""
    zero_truncated_completions: bool = False
    """Score truncated completions 0 before computing advantages, so a cut reply never pays:
    for short answers (one number), not where a long answer is the task (RESULTS.md)."""
    # --- eval, checkpoints, logging
    eval_steps: int = Field(0, ge=0)
    """Evaluate every N steps, and at start and end; 0 = no eval."""
    eval_num_examples: int = Field(32, ge=-1)
    """Eval examples (-1 = the whole eval split; 0 is refused)."""
    save_steps: int = Field(50, ge=0)
    """Checkpoint every N steps (and at the end or on stop); 0 = only at the end."""
    save_total_limit: int = Field(2, ge=0)
    """Checkpoints kept (oldest deleted first); 0 = keep all."""
    output_dir: str = "outputs"
    """Parent folder of run directories."""
    run_name: str = ""
    """Run directory name under output_dir (one folder name: no '/', not '..');
    default: <env id>--<model name>."""
    seed: int = Field(0, ge=0)
    """Seed for data order, LoRA init, dropout, and rollout sampling: every rollout request
    carries a seed derived from it, the step and the group (client/sampling.py)."""
    report_to: list[ReportTarget] = Field(default_factory=lambda: ["jsonl"])
    """Trackers besides metrics.jsonl (always written) and the console: wandb, tensorboard
    ("jsonl" is accepted and changes nothing)."""
    logging_steps: int = Field(1, ge=1)
    """Console/wandb/tensorboard log every N steps (metrics.jsonl gets every step)."""
    # --- adapter sync
    sync_timeout: float = Field(120.0, gt=0)
    """Seconds the server may be unreachable or busy before the run stops with an error: the
    adapter load and its check each retry this long (the whole hot-load is bounded by twice
    this plus 5 s), and rollouts retry a server blip this long."""
    adapter_probe_tolerance: float = Field(0.2, ge=0, allow_inf_nan=True)
    """Max median |logprob difference| server vs trainer on the probe's tokens (fp32 server:
    ~1e-6, bf16: ~0.02-0.1); inf skips the probe."""

    @field_validator("report_to", mode="before")
    @classmethod
    def _report_to_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("max_concurrent", "eval_num_examples")
    @classmethod
    def _not_zero(cls, value: int) -> int:
        if value == 0:
            raise ValueError("0 would run nothing: use -1 (all) or a number >= 1")
        return value

    @field_validator("lora_target_modules")
    @classmethod
    def _some_lora_targets(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, list) and not value:
            raise ValueError('is empty: name the modules to adapt, or use "all-linear"')
        return value

    @field_validator("output_dir")
    @classmethod
    def _output_dir_not_blank(cls, value: str) -> str:
        return not_blank(value, "a folder, e.g. \"outputs\"")

    @field_validator("run_name")
    @classmethod
    def _run_name_is_one_folder(cls, value: str) -> str:
        return check_folder_name(value)

    @property
    def clip_high(self) -> float:
        """Upper clip epsilon, defaulting to the lower one."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    @property
    def prompts_per_batch(self) -> int:
        """Distinct prompts per step."""
        return self.batch_size // self.rollouts_per_example

    def sampling_args(self, *, explicit_only: bool = False) -> dict[str, Any]:
        """Rollout sampling args from these keys: every one (the built-in defaults, "off" values
        left out), or only the keys this config sets, which win over the environment's own
        `sampling_args` (precedence in vfkit/client/sampling.py)."""
        if explicit_only:
            return {k: getattr(self, k) for k in SAMPLING_KEYS if k in self.model_fields_set}
        values = {k: getattr(self, k) for k in SAMPLING_KEYS}
        off = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
        return {k: v for k, v in values.items() if off.get(k, object()) != v}

    def rollout_sampling_args(self, env_sampling: SamplingArgs | None) -> SamplingArgs:
        """The sampling args rollouts (and evals) run with: the built-in defaults < the
        environment's own `env_sampling` < the keys this config sets (vfkit/client/sampling.py
        merges the layers). The one place that orders them for training."""
        return merge_sampling_args(
            self.sampling_args(), env_sampling, self.sampling_args(explicit_only=True)
        )

    @property
    def probe_enabled(self) -> bool:
        """Whether adapter sync compares probe logprobs (tolerance inf disables it)."""
        return math.isfinite(self.adapter_probe_tolerance)


class TrainerConfig(Section):
    """[trainer]: where the trainer runs, and its arguments."""

    gpus: Gpus = "auto"
    """GPUs for the trainer: "auto" (the first GPU when one is visible, else the CPU), a count,
    or device ids; 0 = the CPU. More than one runs accelerate; any ids hide the other GPUs."""
    args: TrainerArgs = Field(default_factory=TrainerArgs)
    """Training hyper-parameters."""

    @field_validator("gpus")
    @classmethod
    def _gpus_not_negative(cls, value: Gpus) -> Gpus:
        return check_gpus(value)


class RunConfig(Section):
    """A whole run, one TOML file: the model, [env], [inference] and [trainer]."""

    model: str
    """Base model: a local HF folder or a hub id (SmolLM2-135M-Instruct works offline)."""
    env: EnvConfig
    """The environment to train on."""
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    """The inference server rollouts are sampled from."""
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """The trainer."""

    @field_validator("model")
    @classmethod
    def _model_not_blank(cls, value: str) -> str:
        return not_blank(value, "a local HF folder or a hub id, e.g. \"Qwen/Qwen3-0.6B\"")

    @property
    def args(self) -> TrainerArgs:
        """Shortcut for `trainer.args`."""
        return self.trainer.args

    @property
    def run_name(self) -> str:
        """The run directory name (explicit, or derived from env id and model)."""
        if self.args.run_name:
            return self.args.run_name
        return f"{self.env.id}--{self.model.rstrip('/').split('/')[-1]}"


def gpu_count(gpus: Gpus) -> int:
    """Number of devices a `gpus` value names ("auto": 1, or none on a machine without one)."""
    if gpus == "auto":
        return 1
    return len(gpus) if isinstance(gpus, list) else gpus
