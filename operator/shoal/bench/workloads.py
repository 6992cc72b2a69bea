"""Seeded, reproducible workloads: what a benchmark sends, decided up front.

A workload is a list of requests fixed by its parameters and seed alone, so
every policy in a comparison sees exactly the same prompts in the same order,
and the first N requests do not depend on how many more follow (a shorter run
is a prefix of a longer one). Timing is not part of it: the load driver
decides when each request goes (see `arrivals.py`), except for a replayed
trace, whose requests carry their own timestamps.

Text is made of short pseudo-words (2 to 4 letters after a space), one token
each in the simulator's tokenizer and close to one in a BPE's, so word counts
stand for token counts. Multi-turn conversations resend their history with a
synthetic assistant reply of the turn's output length in place of what the
engine said: the prompts stay a pure function of the seed (and the ideal hit
rate computable from them, see `ideal.py`), while the shared prefixes that
matter for routing (system prompt and earlier turns) are the same as a real
chat client's.
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice

# The role and content of one chat message.
Message = tuple[str, str]


@dataclass(frozen=True, kw_only=True)
class BenchRequest:
    index: int
    max_tokens: int
    messages: tuple[Message, ...] = ()  # a chat completion, or else
    prompt: str | None = None  # a plain completion
    user: str | None = None  # sent as the OpenAI `user` field (a session key)
    group: str = "all"  # requests reported apart (long-tail: "short", "long")
    after: int | None = None  # index of the turn this one answers: sent once that one ends
    at: float | None = None  # seconds from the start (replayed traces only)

    def body(self, model: str) -> dict[str, object]:
        """The OpenAI request body (streamed, with usage, fixed output length)."""
        body: dict[str, object] = {
            "model": model,
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            # Output lengths are part of the workload, not left to the model.
            "ignore_eos": True,
            "temperature": 0.0,
        }
        if self.prompt is not None:
            body["prompt"] = self.prompt
        else:
            body["messages"] = [{"role": r, "content": c} for r, c in self.messages]
        if self.user is not None:
            body["user"] = self.user
        return body

    @property
    def path(self) -> str:
        return "/v1/completions" if self.prompt is not None else "/v1/chat/completions"


@dataclass(frozen=True)
class Workload:
    name: str
    params: dict[str, object]  # everything that determines the requests
    requests: tuple[BenchRequest, ...]
    groups: tuple[str, ...] = field(default=("all",))


def _words(rng: random.Random, count: int) -> str:
    letters = string.ascii_lowercase
    return " ".join(
        "".join(rng.choices(letters, k=rng.randint(2, 4))) for _ in range(max(count, 1))
    )


def _between(rng: random.Random, bounds: tuple[int, int]) -> int:
    return rng.randint(bounds[0], bounds[1])


def _zipf_weights(count: int, exponent: float) -> list[float]:
    return [1.0 / (rank + 1) ** exponent for rank in range(count)]


@dataclass(frozen=True, kw_only=True)
class SharedPrefix:
    """T tenants, each with a long system prompt; many users per tenant; each
    user in multi-turn conversations that resend their whole history.
    Tenants are picked by a Zipf law (a few popular ones, a long tail of
    quiet ones), users uniformly within a tenant; `active` conversations are
    interleaved at any time, as many users chat at once."""

    seed: int = 0
    tenants: int = 48
    users_per_tenant: int = 16
    system_words: int = 2000
    user_words: tuple[int, int] = (40, 160)
    turns: tuple[int, int] = (2, 6)
    output_tokens: int = 64
    active: int = 64
    tenant_skew: float = 0.8  # Zipf exponent of tenant popularity (0: uniform)
    send_user: bool = True  # send the `user` field (routers may use it as a session key)

    def requests(self) -> Iterator[BenchRequest]:
        # Separate streams, so changing one knob does not reshuffle the rest.
        system_rng = random.Random(f"{self.seed}-system")
        systems = [
            f"You are the assistant of tenant {t}. " + _words(system_rng, self.system_words)
            for t in range(self.tenants)
        ]
        rng = random.Random(f"{self.seed}-chat")
        weights = _zipf_weights(self.tenants, self.tenant_skew)

        def new_conversation() -> _Conversation:
            tenant = rng.choices(range(self.tenants), weights)[0]
            user = rng.randrange(self.users_per_tenant)
            return _Conversation(
                user=f"tenant{tenant}-user{user}",
                history=[("system", systems[tenant])],
                turns_left=_between(rng, self.turns),
            )

        active = [new_conversation() for _ in range(self.active)]
        index = 0
        while True:
            slot = rng.randrange(len(active))
            chat = active[slot]
            chat.history.append(("user", _words(rng, _between(rng, self.user_words))))
            yield BenchRequest(
                index=index,
                messages=tuple(chat.history),
                max_tokens=self.output_tokens,
                user=chat.user if self.send_user else None,
                after=chat.last,
            )
            chat.history.append(("assistant", _words(rng, self.output_tokens)))
            chat.last = index
            chat.turns_left -= 1
            if chat.turns_left == 0:
                active[slot] = new_conversation()
            index += 1


@dataclass
class _Conversation:
    user: str
    history: list[Message]
    turns_left: int
    last: int | None = None


@dataclass(frozen=True, kw_only=True)
class LongTail:
    """Mostly short requests and a few very long ones (long prompts, long
    outputs): round-robin keeps feeding replicas that a long one drags."""

    seed: int = 0
    long_fraction: float = 0.04
    short_prompt_words: tuple[int, int] = (100, 400)
    short_output_tokens: tuple[int, int] = (32, 96)
    long_prompt_words: tuple[int, int] = (4000, 7000)
    long_output_tokens: tuple[int, int] = (512, 1024)

    def requests(self) -> Iterator[BenchRequest]:
        rng = random.Random(f"{self.seed}-long-tail")
        index = 0
        while True:
            long = rng.random() < self.long_fraction
            words = self.long_prompt_words if long else self.short_prompt_words
            output = self.long_output_tokens if long else self.short_output_tokens
            yield BenchRequest(
                index=index,
                messages=(("user", _words(rng, _between(rng, words))),),
                max_tokens=_between(rng, output),
                group="long" if long else "short",
            )
            index += 1


@dataclass(frozen=True, kw_only=True)
class RandomPrompts:
    """Unrelated prompts: nothing to share, so routing can only lose here."""

    seed: int = 0
    prompt_words: tuple[int, int] = (200, 1200)
    output_tokens: tuple[int, int] = (32, 128)

    def requests(self) -> Iterator[BenchRequest]:
        rng = random.Random(f"{self.seed}-random")
        index = 0
        while True:
            # A unique opening word, so no two prompts share even a first block.
            text = f"q{index} " + _words(rng, _between(rng, self.prompt_words))
            yield BenchRequest(
                index=index,
                messages=(("user", text),),
                max_tokens=_between(rng, self.output_tokens),
            )
            index += 1


Generator = SharedPrefix | LongTail | RandomPrompts
GENERATORS: dict[str, type[Generator]] = {
    "shared-prefix": SharedPrefix,
    "long-tail": LongTail,
    "random": RandomPrompts,
}


def synthetic(name: str, *, count: int, seed: int = 0, **params: object) -> Workload:
    """The first `count` requests of a named synthetic workload."""
    kind = GENERATORS[name]
    generator = kind(seed=seed, **params)  # type: ignore[arg-type]
    requests = tuple(islice(generator.requests(), count))
    groups = ("short", "long") if isinstance(generator, LongTail) else ("all",)
    described: dict[str, object] = {"name": name, "requests": count}
    described.update(
        {k: list(v) if isinstance(v, tuple) else v for k, v in vars(generator).items()}
    )
    return Workload(name=name, params=described, requests=requests, groups=groups)
