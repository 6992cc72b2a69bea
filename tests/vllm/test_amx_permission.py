"""Every interpreter of the real-vLLM venv asks Linux for AMX tile state at
start (hack/vllm/startup/shoal_amx_permission.py says why): on a CPU with AMX
the permission is held before vLLM's own AMX kernels run; elsewhere the hook
is loaded and changes nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

# The process's permitted dynamic XSTATE features (ARCH_GET_XCOMP_PERM), bit 18
# being AMX tile data; printed as "<hook loaded> <tile data permitted>".
_PROBE = """
import ctypes, sys
perm = ctypes.c_uint64(0)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall(158, 0x1022, ctypes.byref(perm))
print("shoal_amx_permission" in sys.modules, bool(perm.value >> 18 & 1))
"""


def _cpu_has_amx() -> bool:
    return "amx_tile" in Path("/proc/cpuinfo").read_text()


def test_the_venv_asks_for_amx_at_every_start(vllm_python: Path) -> None:
    done = subprocess.run(
        [str(vllm_python), "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    loaded, permitted = done.stdout.split()
    assert loaded == "True", "the start-up hook is not installed: run hack/vllm/install.sh"
    assert permitted == str(_cpu_has_amx())
