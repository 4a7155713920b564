"""One error root, with a family for transient faults that are retried with bounded backoff."""

from __future__ import annotations


class CronmanError(Exception):
    """Root of every error cronman raises on purpose."""

    code = "error"
    status = 500

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code

    def to_dict(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message, "field": self.field}


class InvalidInput(CronmanError):
    code = "invalid_input"
    status = 400


class Unauthorized(CronmanError):
    code = "unauthorized"
    status = 401


class Forbidden(CronmanError):
    code = "forbidden"
    status = 403


class NotFound(CronmanError):
    code = "not_found"
    status = 404


class Conflict(CronmanError):
    code = "conflict"
    status = 409


class PreconditionFailed(CronmanError):
    """412: a conditional request (``If-Match``) whose condition no longer holds."""

    code = "precondition_failed"
    status = 412


class UnsupportedMediaType(CronmanError):
    code = "unsupported_media_type"
    status = 415


class PayloadTooLarge(CronmanError):
    code = "payload_too_large"
    status = 413


class QuotaExceeded(CronmanError):
    """A namespace asked for more than a quota allows: the message names the quota and the setting
    that changes it. 409 for a count (another write fits once something is deleted), 413 for a size."""

    code = "quota_exceeded"
    status = 409

    def __init__(self, message: str, *, quota: str, field: str | None = None, status: int | None = None) -> None:
        super().__init__(message, field=field)
        self.quota = quota
        if status is not None:
            self.status = status

    def to_dict(self) -> dict[str, object]:
        return {**super().to_dict(), "quota": self.quota}


class TransientError(CronmanError):
    """A fault that may pass by itself (connection reset, timeout): retry with backoff."""

    code = "transient"
    status = 503


class ConfigError(CronmanError):
    code = "config_error"
