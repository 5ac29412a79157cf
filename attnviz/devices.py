"""Device choice: cpu, cuda, mps or auto (cuda if available, else mps, else cpu)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from attnviz.errors import DeviceError

DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")


def _mps_available() -> bool:
    return hasattr(torch.backends, "mps") and torch.backends.mps.is_available()


def available_devices() -> list[str]:
    """The concrete devices this machine has, cpu always first."""
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices.append("cuda")
    if _mps_available():
        devices.append("mps")
    return devices


def resolve_device(name: str | None = "auto") -> torch.device:
    """The torch device for ``name``; raises DeviceError when it is not on this machine."""
    name = (name or "auto").lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if _mps_available() else "cpu")
    if name.split(":")[0] not in DEVICE_CHOICES[1:]:
        raise DeviceError(f"unknown device {name!r}; choose one of {', '.join(DEVICE_CHOICES)}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError("device 'cuda' was asked for but no CUDA GPU is available; use 'cpu' or 'auto'")
    if name == "mps" and not _mps_available():
        raise DeviceError("device 'mps' was asked for but Apple's MPS is not available; use 'cpu' or 'auto'")
    return torch.device(name)


def device_name(device: torch.device) -> str:
    """The hardware behind ``device``, for the record: the GPU's name, or the CPU's model name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass  # not Linux: platform knows less, but something
    return platform.processor() or platform.machine() or device.type


# oneDNN's ISA limits (its documented ONEDNN_MAX_CPU_ISA values) that stop below native bfloat16 products.
ONEDNN_WITHOUT_BF16 = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"})


def fast_bfloat16(device: torch.device) -> tuple[bool, str]:
    """Whether ``device`` multiplies bfloat16 natively (much faster than float32), and how that is known.

    A CUDA GPU says so itself; a CPU has it with the ``amx_bf16`` or ``avx512_bf16`` flag. Without
    them, torch emulates bfloat16 products: on an AMD EPYC with AVX2 only a bf16 linear layer under
    autocast took 5x its float32 time. Nor does a CPU where ``ONEDNN_MAX_CPU_ISA`` holds oneDNN below
    them (``AVX2``, ``AVX512_CORE``, ...: how a faster CPU stands in for an older one).
    """
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(), "torch.cuda.is_bf16_supported()"
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if limit in ONEDNN_WITHOUT_BF16:  # oneDNN told to stay below its bfloat16 kernels: it emulates them
        return False, f"ONEDNN_MAX_CPU_ISA={limit} keeps oneDNN below its bfloat16 instructions"
    flags = cpu_flags()
    if flags is None:
        return False, "no /proc/cpuinfo to read CPU flags from"
    found = sorted(flags & {"amx_bf16", "avx512_bf16"})
    return bool(found), ("CPU flags: " + ", ".join(found)) if found else "no amx_bf16 or avx512_bf16 CPU flag"


def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags as Linux lists them (``avx2``, ``avx512f``, ``amx_tile``, ...); None where there
    is no /proc/cpuinfo to read them from."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return frozenset(word for line in text.splitlines() if line.startswith("flags") for word in line.split()[2:])
