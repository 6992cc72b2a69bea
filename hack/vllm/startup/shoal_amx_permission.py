"""Ask Linux for AMX tile state at every interpreter start in the real-vLLM venv.

Linux hands out AMX (the XTILEDATA state component) only to a process that asked
for it with `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`; the first AMX
instruction of a process that did not ask is killed with SIGILL. The permission
is inherited on fork and cleared on exec, so every interpreter that vLLM starts
(API server, engine core, workers) must ask itself: this module runs from a
`.pth` file that `hack/vllm/install.sh` puts into the venv's site-packages.

Why: on a CPU with AMX and bf16, vLLM 0.32's CPU build picks its own AMX
attention kernel (`vllm/v1/attention/backends/cpu_attn.py`, ISA "amx"), which
does not ask. Its bundled oneDNN does ask, but only once a matmul is large
enough for its AMX kernels: a first prompt of two tokens reaches the attention
kernel first and the worker dies with exit code -4; a long first prompt goes
through oneDNN's AMX path first and hides the fault. PyTorch has the same call
(`torch.cpu._init_amx()`); doing it here needs no torch import in every
interpreter of the venv (pip's included).

On a CPU or kernel without AMX the call fails with EINVAL and nothing changes.
"""

from __future__ import annotations

import ctypes
import os
import platform

_SYS_ARCH_PRCTL = 158  # x86_64
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def request() -> bool:
    """True when the kernel granted AMX tile state to this process."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0)
    except (OSError, AttributeError):
        return False


if os.environ.get("SHOAL_VLLM_AMX_PERMISSION", "1") != "0":
    request()
