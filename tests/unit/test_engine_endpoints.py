"""The engine's error answers, read from vLLM 0.32's recorded bodies, and its
addresses."""

from __future__ import annotations

import pytest

from shoal.engine.endpoints import ErrorBody, base_url, parse_error
from shoal.engine.errors import ErrorStatus
from tests.sim_fixtures import text


@pytest.mark.parametrize(
    ("fixture", "kind", "param", "code"),
    [
        ("error.unknown_model.txt", "NotFoundError", "model", 404),
        ("error.too_long.txt", "BadRequestError", "max_tokens", 400),
        ("error.bad_json.txt", "Bad Request", "body.42", 400),
    ],
)
def test_vllms_error_answers_say_what_was_wrong(
    fixture: str, kind: str, param: str, code: int
) -> None:
    body, status = text(fixture).strip().rsplit("\nHTTP ", 1)
    error = ErrorStatus(path="/v1/completions", status=int(status), text=body)
    assert error.status == code
    assert error.error is not None
    assert (error.error.type, error.error.param, error.error.code) == (kind, param, code)
    assert str(error).startswith(f"/v1/completions answered {code}: ")


def test_an_answer_not_in_vllms_error_shape_has_no_error_body() -> None:
    assert parse_error("Internal Server Error") is None
    assert parse_error('{"detail": "Not Found"}') is None
    assert parse_error('{"error": {"message": "m"}}') == ErrorBody(message="m")


def test_engine_addresses_bracket_ipv6() -> None:
    assert base_url("10.0.0.5", port=8000) == "http://10.0.0.5:8000"
    assert base_url("fd00::5", port=8000) == "http://[fd00::5]:8000"
