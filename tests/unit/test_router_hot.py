"""The router's hot prefixes: kept in the form the requests had (text for
completions, leading messages for chat), bounded however many prompts pass."""

from __future__ import annotations

from typing import Any

from shoal.router.hot import HotPrefixes
from shoal.router.prefix import prefix_key, render_prompt

SYSTEM = "You are the support desk of the shoal fleet; answer from the manual. " * 4


def _observe(hot: HotPrefixes, body: dict[str, Any]) -> None:
    """What the proxy does with each request."""
    prompt = render_prompt(body)
    hot.observe(prompt, prefix_key(prompt, block_chars=64, max_blocks=1024), body)


def _chat(*contents: str, system: str = SYSTEM) -> dict[str, Any]:
    roles = ["user", "assistant"]
    messages = [{"role": "system", "content": system}]
    messages += [{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)]
    return {"model": "m", "messages": messages}


def test_completions_keep_text_prefixes_of_doubling_blocks() -> None:
    hot = HotPrefixes(top_k=8, max_chars=256, block_chars=64)
    for i in range(3):
        _observe(hot, {"prompt": SYSTEM + f"Question {i}?"})
    # Token ids: their text form is not what the engine would see.
    _observe(hot, {"prompt": [[1, 2, 3] * 100]})
    top = hot.top()
    assert [len(p["prompt"]) for p in top] == [256, 128, 64]  # type: ignore[arg-type]
    assert all(SYSTEM.startswith(p["prompt"]) and p["count"] == 3 for p in top)  # type: ignore[arg-type]
    assert all("messages" not in p for p in top)


def test_chat_keeps_the_shared_system_message_as_messages() -> None:
    hot = HotPrefixes(top_k=8, max_chars=4096, block_chars=64)
    for i in range(4):
        _observe(hot, _chat(f"Question {i}: how do I scale?"))
    # Only the shared part, as messages: not the router's rendered text, and
    # never a request's last message (its own question).
    assert hot.top() == [{"messages": [{"role": "system", "content": SYSTEM}], "count": 4}]


def test_chat_keeps_the_first_messages_that_conversations_share() -> None:
    hot = HotPrefixes(top_k=8, max_chars=4096, block_chars=64)
    shots = ["Example question.", "Example answer."]
    for i in range(6):
        _observe(hot, _chat(*shots, f"Question {i}?"))
    # A longer prefix enters once the shorter one is known: a message a request.
    assert [(len(p["messages"]), p["count"]) for p in hot.top()] == [(1, 6), (2, 5), (3, 4)]  # type: ignore[arg-type]
    assert hot.top()[2]["messages"][1:] == [  # type: ignore[index]
        {"role": "user", "content": shots[0]},
        {"role": "assistant", "content": shots[1]},
    ]


def test_one_conversations_turns_do_not_make_its_history_hot() -> None:
    hot = HotPrefixes(top_k=8, max_chars=4096, block_chars=64)
    history: list[str] = []
    for turn in range(6):
        history += [f"Question {turn}?"]
        _observe(hot, _chat(*history))
        history += [f"Answer {turn}."]
    # Its history repeats in every later turn, but nothing else shares it.
    assert hot.top() == []
    _observe(hot, _chat("Another conversation."))
    assert hot.top() == [{"messages": [{"role": "system", "content": SYSTEM}], "count": 2}]


def test_chat_prefixes_are_cut_at_max_chars() -> None:
    hot = HotPrefixes(top_k=8, max_chars=100, block_chars=64)
    for i in range(3):
        _observe(hot, _chat(f"Question {i}?"))
    [top] = hot.top()
    # The system message cut: its first 100 characters still warm their blocks.
    assert top["messages"] == [{"role": "system", "content": SYSTEM[:100]}]


def test_chat_stops_at_what_messages_alone_cannot_reproduce() -> None:
    hot = HotPrefixes(top_k=8, max_chars=4096, block_chars=64)
    named = {"role": "user", "content": "Example question.", "name": "alice"}
    for i in range(3):
        body = _chat("Example question.", f"Question {i}?")
        body["messages"][1] = named
        _observe(hot, body)
        # Tools are rendered by the chat template: such requests are not kept.
        _observe(hot, {**_chat(f"Tool question {i}?", system="Call tools."), "tools": [{}]})
    assert hot.top() == [{"messages": [{"role": "system", "content": SYSTEM}], "count": 3}]


def test_memory_stays_bounded_and_shared_prefixes_stay_on_top() -> None:
    hot = HotPrefixes(top_k=16, max_chars=512, block_chars=64)
    for i in range(4000):
        # Prompts nobody shares, five prefixes each, all but a few evicted.
        _observe(hot, {"prompt": f"Tenant {i} says hello. " * 20})
        _observe(hot, _chat(f"Tenant {i} asks a question.", system=f"Tenant {i} system. " * 5))
        if i % 4 == 0:
            _observe(hot, {"prompt": SYSTEM + f"Question {i}?"})
            _observe(hot, _chat(f"Question {i}?"))
    assert len(hot._entries) == hot.capacity
    top = hot.top()
    assert len(top) <= 16
    assert {"messages": [{"role": "system", "content": SYSTEM}], "count": top[0]["count"]} in top
    assert any(p.get("prompt") == SYSTEM[:256] for p in top)
