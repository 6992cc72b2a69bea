"""shoal: run vLLM as data-parallel fleets on Kubernetes."""

__version__ = "0.1.0"
