"""A vLLM 0.32 engine simulator: the same wire format and metrics as vLLM,
an engine's behaviour under load (prefix cache, batching, preemption) in
scaled time, and fault injection. `shoal sim` runs it; `run_engines` starts
engines inside a Python event loop."""

from shoal.sim.config import EngineConfig
from shoal.sim.faults import Faults
from shoal.sim.profiles import PROFILES, Profile
from shoal.sim.server import Address, EngineServer, run_engines

__all__ = [
    "PROFILES",
    "Address",
    "EngineConfig",
    "EngineServer",
    "Faults",
    "Profile",
    "run_engines",
]
