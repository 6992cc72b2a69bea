"""Accepted API keys: a file of one key per line, usually a mounted Secret,
re-read when it changes so keys rotate without restarting the router (which
would also empty its prefix index)."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

log = logging.getLogger("shoal.router")


class KeyFileError(Exception):
    """The file cannot be read or holds no key."""


def read_keys(path: Path) -> list[bytes]:
    """The keys in path, one per line (blank lines and surrounding whitespace
    ignored). An unreadable file or one with no key is an error: a router
    given a key file must never serve without authentication."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise KeyFileError(f"API key file {path}: {error.strerror or error}") from error
    keys = [line.strip() for line in data.splitlines() if line.strip()]
    if not keys:
        raise KeyFileError(f"API key file {path}: no keys in it (one key per line)")
    return keys


class Keys:
    """Accepted keys, checked by their SHA-256 digests: one hash and one set
    lookup per request however many keys there are (comparing the token with
    each key, as before, cost 1.35 ms a request at 10,000 keys, twenty times
    the router's whole work). The lookup's timing depends on the token's
    digest, which says nothing of any key."""

    def __init__(self, keys: list[bytes]) -> None:
        self.keys = keys  # in the file's order: the first is the peers' key
        self._digests = frozenset(hashlib.sha256(key).digest() for key in keys)

    def __bool__(self) -> bool:
        return bool(self.keys)

    def accepts(self, token: bytes) -> bool:
        return hashlib.sha256(token).digest() in self._digests


_MISSING = (-1, -1, -1)


def _stamp(path: Path) -> tuple[int, int, int]:
    # stat follows symlinks: kubelet updates a Secret volume by swapping the
    # `..data` link to a new directory, so the inode changes with the content.
    try:
        st = path.stat()
    except OSError:
        return _MISSING
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class KeyFile:
    """The keys of one file, as last read successfully."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = _stamp(path)
        self._bad_stamp: tuple[int, int, int] | None = None
        self.keys = read_keys(path)

    def refresh(self) -> bool:
        """Re-read the file if it changed; True when the keys changed. A file
        that became unreadable or empty keeps the previous keys (logged): a
        half-written Secret must not lock every client out, nor let everyone in."""
        stamp = _stamp(self.path)
        if stamp == self._stamp or stamp == self._bad_stamp:
            return False
        try:
            keys = read_keys(self.path)
        except KeyFileError as error:
            self._bad_stamp = stamp  # said once, not every period
            log.warning("%s; keeping the previous %d key(s)", error, len(self.keys))
            return False
        self._stamp = stamp
        if keys == self.keys:
            return False
        self.keys = keys
        log.info("API keys reloaded from %s: %d key(s)", self.path, len(keys))
        return True
