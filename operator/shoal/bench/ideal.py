"""The prefix hit rate one infinitely large replica would get on a workload.

No routing can beat it: every block any earlier request computed is still
cached, on the one replica every request goes to. Accounting follows the
engine's (`vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`,
in tokens): a request queries all its prompt tokens and hits its leading full
blocks already seen, never the last prompt token (so at most
floor((n - 1) / B) blocks of B tokens). Prompts are tokenized as the
simulator does (its chat template and tokenizer); on a real engine the
result is an estimate, as its tokenizer cuts text differently.
"""

from __future__ import annotations

from collections.abc import Iterable

from shoal.bench.workloads import BenchRequest
from shoal.sim.profiles import Profile
from shoal.sim.tokenizer import Tokenizer, render_chat


class PromptTokens:
    """Token ids of requests' prompts as the simulator sees them.

    The chat template renders each message as its own part, `<|role|>\\n`,
    content, `\\n`; the tokenizer never joins text across a part boundary
    (a part ends in a newline, the next starts with `<`), so each message is
    tokenized once and reused by every later turn that resends it."""

    def __init__(self, profile: Profile) -> None:
        self.tokenizer = Tokenizer(vocab_size=profile.vocab_size, bos_token_id=profile.bos_token_id)
        self._parts: dict[tuple[str, str], list[int]] = {}
        self._tail = self.tokenizer.encode(render_chat([]), add_special_tokens=False)

    def __call__(self, request: BenchRequest) -> list[int]:
        if request.prompt is not None:
            return self.tokenizer.encode(request.prompt)
        bos = self.tokenizer.bos_token_id
        tokens = [] if bos is None else [bos]
        for message in request.messages:
            tokens += self._part(message)
        return tokens + self._tail

    def _part(self, message: tuple[str, str]) -> list[int]:
        part = self._parts.get(message)
        if part is None:
            role, content = message
            rendered = render_chat([{"role": role, "content": content}])
            part = self.tokenizer.encode(rendered, add_special_tokens=False)[: -len(self._tail)]
            self._parts[message] = part
        return part


def ideal_hit_rate(requests: Iterable[BenchRequest], *, profile: Profile) -> float:
    """Hit tokens over queried tokens, requests in workload order."""
    tokens = PromptTokens(profile)
    return hit_rate_of(map(tokens, requests), block_size=profile.block_size)


def hit_rate_of(prompts: Iterable[list[int]], *, block_size: int) -> float:
    seen: set[int] = set()
    hits = queries = 0
    for tokens in prompts:
        queries += len(tokens)
        cacheable = (len(tokens) - 1) // block_size  # never the last token
        parent = 0
        hitting = True
        for b in range(len(tokens) // block_size):
            # Chained, as the engine's block hashes: equal means equal prefix.
            parent = hash((parent, tuple(tokens[b * block_size : (b + 1) * block_size])))
            if hitting and parent in seen and b < cacheable:
                hits += block_size
            else:
                hitting = False
            seen.add(parent)
    return hits / queries if queries else 0.0
