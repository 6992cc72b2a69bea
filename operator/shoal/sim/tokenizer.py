"""A deterministic stand-in for a model's tokenizer.

Text splits into word-like pieces (a leading space kept with its word, long
words cut into 5-character pieces, so English comes out near 4 to 5
characters a token, as with BPE). A piece that the simulator itself can produce maps back
to its id; any other piece maps to an id by a stable hash: a pure function,
the same in every process. Equal texts give
equal ids and a shared text prefix gives a shared id prefix, which is all the
prefix cache and a cache-aware router need.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

_PIECE = re.compile(r" ?[A-Za-z0-9]+| ?[^\sA-Za-z0-9]|\s+")
_MAX_PIECE_CHARS = 5
# Ids below this are reserved for special tokens (BOS, EOS, padding, ...).
_FIRST_WORD_ID = 16
_SYLLABLES = [c + v for c in "bdklmnrstv" for v in "aeiou"]
_SYLLABLE_INDEX = {s: i for i, s in enumerate(_SYLLABLES)}
_SYLLABLE = "(" + "|".join(_SYLLABLES) + ")"
_SYLLABLE_PIECE = re.compile(f" {_SYLLABLE}{_SYLLABLE}?")


class Tokenizer:
    def __init__(self, *, vocab_size: int, bos_token_id: int | None) -> None:
        if vocab_size <= _FIRST_WORD_ID:
            raise ValueError(f"vocab_size must exceed {_FIRST_WORD_ID}")
        self.vocab_size = vocab_size
        self.bos_token_id = bos_token_id

    def piece(self, token_id: int) -> str:
        """The text of a word token: a space and one or two syllables."""
        n = len(_SYLLABLES)
        i = token_id - _FIRST_WORD_ID
        second = i // n
        return " " + _SYLLABLES[i % n] + (_SYLLABLES[(second - 1) % n] if second else "")

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = [self.bos_token_id] if add_special_tokens and self.bos_token_id is not None else []
        for match in _PIECE.finditer(text):
            word = match.group()
            for start in range(0, len(word), _MAX_PIECE_CHARS):
                ids.append(self._piece_id(word[start : start + _MAX_PIECE_CHARS]))
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(self.piece(t) for t in token_ids if t >= _FIRST_WORD_ID)

    def word_ids(self) -> range:
        """The ids a generated token may take: no special tokens, and only ids
        whose text is their own (up to two syllables), so output round-trips."""
        n = len(_SYLLABLES)
        return range(_FIRST_WORD_ID, min(self.vocab_size, _FIRST_WORD_ID + n + n * n))

    def _piece_id(self, piece: str) -> int:
        # A piece the simulator generates maps back to its own id, so generated
        # text sent back in a later turn tokenizes as it was generated.
        syllables = _SYLLABLE_PIECE.fullmatch(piece)
        if syllables is not None:
            n = len(_SYLLABLES)
            first, second = syllables.group(1), syllables.group(2)
            i = _SYLLABLE_INDEX[first] + (n * (_SYLLABLE_INDEX[second] + 1) if second else 0)
            if _FIRST_WORD_ID + i < self.vocab_size:
                return _FIRST_WORD_ID + i
        digest = hashlib.blake2b(piece.encode(), digest_size=8).digest()
        span = self.vocab_size - _FIRST_WORD_ID
        return _FIRST_WORD_ID + int.from_bytes(digest, "little") % span


def render_chat(messages: Sequence[dict[str, object]]) -> str:
    """A fixed chat template: one block per message, then the assistant's turn
    (the fixtures' model's template; Jinja drops the template's final newline,
    so the prompt ends at `<|assistant|>`)."""
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            content = "".join(
                str(part.get("text", "")) for part in content if isinstance(part, dict)
            )
        parts.append(f"<|{message.get('role', 'user')}|>\n{content or ''}\n")
    parts.append("<|assistant|>")
    return "".join(parts)
