"""`shoal router`'s command line."""

from __future__ import annotations

import argparse
from pathlib import Path

from shoal.router import cli


def test_the_flag_is_parsed_as_a_path() -> None:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["router", "--endpoints", "http://a:8000", "--api-key-file", "/etc/keys/k"]
    )
    assert args.api_key_file == Path("/etc/keys/k")
