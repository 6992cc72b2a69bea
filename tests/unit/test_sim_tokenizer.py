"""The simulator's tokenizer is deterministic and keeps shared prefixes shared."""

from __future__ import annotations

from shoal.sim.tokenizer import Tokenizer, render_chat


def test_same_text_same_ids_in_any_tokenizer_instance() -> None:
    text = "The quick brown fox jumps over extraordinarily lazy dogs, 42 times!"
    a = Tokenizer(vocab_size=1024, bos_token_id=None).encode(text)
    b = Tokenizer(vocab_size=1024, bos_token_id=None).encode(text)
    assert a == b
    assert all(16 <= t < 1024 for t in a)
    assert 10 <= len(a) <= 25  # BPE-like: several characters a token


def test_a_shared_text_prefix_gives_a_shared_token_prefix() -> None:
    tok = Tokenizer(vocab_size=128256, bos_token_id=128000)
    system = "You are a helpful assistant. Answer briefly and cite sources. " * 5
    a = tok.encode(system + "What is the capital of France?")
    b = tok.encode(system + "Name three rivers in Germany.")
    shared = tok.encode(system)
    assert a[0] == 128000
    assert a[: len(shared) - 1] == b[: len(shared) - 1] == shared[:-1]


def test_generated_text_tokenizes_back_to_the_generated_ids() -> None:
    tok = Tokenizer(vocab_size=128256, bos_token_id=128000)
    ids = list(tok.word_ids())[::37]
    assert tok.encode(tok.decode(ids), add_special_tokens=False) == ids


def test_chat_template_renders_every_message_and_opens_the_assistant_turn() -> None:
    text = render_chat(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    )
    assert text == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>"


def test_chat_template_renders_as_the_fixtures_model_did() -> None:
    """api.tokenize.chat.txt's 33 tokens, decoded with the tiny model's
    tokenizer (hack/vllm/make_tiny_model.py): its template's final newline is
    dropped, as Jinja drops a template's trailing newline by default."""
    text = render_chat([{"role": "user", "content": "Name a colour of the sky."}])
    assert text == "<|user|>\nName a colour of the sky.\n<|assistant|>"
