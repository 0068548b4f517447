"""Refused requests: an HTTP status, a stable code and what to change.

Admission, operator actions, authentication and webhooks all refuse through this
one exception; the HTTP front end turns it into an RFC 9457 problem. A request
refused this way has changed nothing.
"""

from __future__ import annotations

from typing import Any


class Problem(Exception):
    def __init__(self, status: int, code: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail, self.extra = status, code, detail, extra
