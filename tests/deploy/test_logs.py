"""JSON log lines, with credentials masked, from the application and from gunicorn alike."""

from __future__ import annotations

import io
import json
import logging
import logging.config
from collections.abc import Iterator

import pytest

from cronman.logs import REDACTED, JsonFormatter, RedactingFilter, json_handler, logconfig_dict


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    logger = logging.getLogger("cronman.test.logs")
    handler = json_handler(stream)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, stream
    logger.removeHandler(handler)
    logger.propagate = True


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_one_json_line_per_event_with_extra_fields(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    logger.info("fired %s", "job-1", extra={"job_id": "job-1", "execution_id": "e-1", "attempt": 2})
    logger.warning("second\nline")
    first, second = lines(stream)
    assert first["msg"] == "fired job-1" and first["level"] == "info" and first["logger"] == "cronman.test.logs"
    assert (first["job_id"], first["execution_id"], first["attempt"]) == ("job-1", "e-1", 2)
    assert str(first["ts"]).endswith("Z")
    assert second["msg"] == "second\nline"


@pytest.mark.parametrize(
    "key",
    [
        "authorization",
        "Authorization",
        "token",
        "access_token",
        "secret",
        "client_secret",
        "password",
        "passwd",
        "api_key",
        "apiKey",
        "x-api-key",
        "headers",
        "target_headers",
        "cookie",
    ],
)
def test_credential_like_extra_fields_are_masked(captured: tuple[logging.Logger, io.StringIO], key: str) -> None:
    logger, stream = captured
    logger.info("calling", extra={key: "s3cr3t-value", "job_id": "j"})
    (line,) = lines(stream)
    assert line[key] == REDACTED
    assert line["job_id"] == "j"
    assert "s3cr3t-value" not in stream.getvalue()


def test_nested_values_are_masked_without_touching_the_caller_s_object(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured
    target = {"url": "https://example.com/hook", "headers": {"Authorization": "Bearer abc"}, "auth": {"token": "t"}}
    logger.info("job", extra={"target": target, "attempts": [{"password": "p", "n": 1}]})
    (line,) = lines(stream)
    assert line["target"] == {"url": "https://example.com/hook", "headers": REDACTED, "auth": {"token": REDACTED}}
    assert line["attempts"] == [{"password": REDACTED, "n": 1}]
    assert target["headers"] == {"Authorization": "Bearer abc"}  # the caller's dict is left alone
    for secret in ("Bearer abc", '"t"', '"p"'):
        assert secret not in stream.getvalue()


def test_the_filter_never_drops_a_record() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", (), None)
    record.token = "abc"  # type: ignore[attr-defined]
    assert RedactingFilter().filter(record) is True
    assert record.token == REDACTED  # type: ignore[attr-defined]
    assert json.loads(JsonFormatter().format(record))["token"] == REDACTED


def test_gunicorn_logconfig_writes_redacted_json(capsys: pytest.CaptureFixture[str]) -> None:
    """The dictConfig document gunicorn applies: its own error log and ours both become JSON lines."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    names = ("gunicorn.error", "gunicorn.access", "cronman")
    saved_loggers = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).level) for n in names}
    # An in-process simulation run earlier in this process quiets "cronman" (level, propagation):
    # start from a process's defaults, as gunicorn does.
    cronman_logger = logging.getLogger("cronman")
    saved_propagate = cronman_logger.propagate
    cronman_logger.setLevel(logging.NOTSET)
    cronman_logger.propagate = True
    try:
        logging.config.dictConfig(logconfig_dict("info"))
        logging.getLogger("gunicorn.error").info("Booting worker with pid: %s", 42)
        logging.getLogger("gunicorn.access").info("not written: below WARNING")
        logging.getLogger("cronman.api").info("hello", extra={"api_key": "k3y"})
        err = capsys.readouterr().err
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
        for n, (handlers, level) in saved_loggers.items():
            logging.getLogger(n).handlers[:] = handlers
            logging.getLogger(n).setLevel(level)
        cronman_logger.propagate = saved_propagate
    docs = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert {"logger": "gunicorn.error", "msg": "Booting worker with pid: 42"}.items() <= docs[0].items()
    assert docs[1]["logger"] == "cronman.api" and docs[1]["api_key"] == REDACTED
    assert len(docs) == 2
