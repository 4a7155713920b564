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


def test_every_line_is_ascii_json_whatever_its_values(captured: tuple[logging.Logger, io.StringIO]) -> None:
    # The usual line goes through orjson; what it cannot write as the standard library does goes
    # through json.dumps. Either way: one line, ASCII only, the values as given.
    import datetime
    import time

    logger, stream = captured
    odd: list[dict[str, object]] = [
        {"text": "zürich ☃ \u2028 \ud800"},  # beyond ASCII, a line separator, a lone surrogate
        {"big": 2**70, "neg": -(2**64)},  # beyond orjson's 64 bits
        {"keyed": {1: "one", None: "none"}},  # keys that are not strings
        {"when": datetime.datetime(2026, 11, 29, tzinfo=datetime.UTC), "obj": object()},  # str() of them
        {"nan": float("nan")},
    ]
    for extra in odd:
        logger.info("odd", extra=extra)
    raw = stream.getvalue().splitlines()
    assert len(raw) == len(odd) and all(line.isascii() for line in raw)
    got = [json.loads(line) for line in raw]
    assert got[0]["text"] == "zürich ☃ \u2028 \ud800"
    assert (got[1]["big"], got[1]["neg"]) == (2**70, -(2**64))
    assert got[2]["keyed"] == {"1": "one", "null": "none"}
    assert got[3]["when"] == "2026-11-29 00:00:00+00:00" and str(got[3]["obj"]).startswith("<object object")
    assert got[4]["nan"] is None or got[4]["nan"] != got[4]["nan"]  # (null, or NaN as json.dumps writes it)
    # The time stamp, kept per second, is the record's own, to the millisecond.
    record = logging.LogRecord("x", logging.INFO, "", 0, "m", (), None)
    for created in (record.created, record.created + 1.5, record.created + 86_400.25):
        record.created, record.msecs = created, (created - int(created)) * 1000
        ts = json.loads(JsonFormatter().format(record))["ts"]
        expected = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(record.msecs):03d}Z"
        assert ts == expected
