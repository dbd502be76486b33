"""Whether a device computes bf16 natively: the one owner of every "auto" precision choice.

bf16 halves memory and, on hardware with bf16 units (CUDA GPUs from Ampere on; x86 CPUs with
AVX512-BF16 or AMX), runs faster than fp32. Elsewhere torch emulates it, and slowly: on an
AVX2-only CPU (AMD EPYC Milan) a 1024x1024 bf16 matmul took 2.65 s against 0.025 s in fp32
(benchmarks/RESULTS.md, "bf16 on a CPU without bf16 units"). The builtin server's
`--dtype auto` and the trainer's `bf16 = "auto"` both ask here:

    resolve_bf16("auto", "cpu")   # True on a Sapphire Rapids or Zen 4 CPU, False on Zen 3
"""

from __future__ import annotations

from pathlib import Path

CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of native bf16 matmuls
SLOW_BF16 = ("this CPU has no native bf16 (AVX512-BF16 or AMX): torch emulates it, ~100x "
             "slower than fp32")


def cpu_supports_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """True when the CPU has native bf16 matmuls (AVX512-BF16 or AMX), where bf16 is fast."""
    try:
        flags = set(cpuinfo.read_text().split())
    except OSError:
        return False
    return any(f in flags for f in CPU_BF16_FLAGS)


def bf16_native(device: str) -> bool:
    """Whether `device` ("cpu", "cuda", "cuda:1", ...) runs bf16 at least as fast as fp32."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.is_bf16_supported()
    return device == "cpu" and cpu_supports_bf16()


def bf16_emulated(device: str) -> bool:
    """Whether bf16 on `device` is a CPU's slow emulation (what a warning should name)."""
    return device == "cpu" and not cpu_supports_bf16()


def resolve_bf16(setting: bool | str, device: str) -> bool:
    """A `bf16` setting (true, false or "auto") made definite for `device`."""
    return bf16_native(device) if setting == "auto" else bool(setting)
