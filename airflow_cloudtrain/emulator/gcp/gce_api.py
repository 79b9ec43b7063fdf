"""The Compute Engine API's conventions, as the emulator speaks them: links, ids and timestamps, errors
in Google's JSON shape, and the ``filter`` / paging of list calls."""

from __future__ import annotations

import base64
import re
import secrets
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow_cloudtrain.emulator.gcp.rest import GoogleError

# A project id as Google allows them (6-30 of a-z, 0-9 and -, a letter first, no - last), or a
# domain-scoped one (``example.com:my-project``); the emulators serve any such project.
PROJECT_ID = re.compile(r"(?:[a-z0-9.-]+:)?[a-z][-a-z0-9]{4,28}[a-z0-9]")
API = "https://www.googleapis.com/compute/v1"  # what selfLinks carry, as in production
_TZ = timezone(timedelta(hours=-7))  # the real API writes RFC 3339 in Pacific time, never "Z"


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, _TZ).isoformat(timespec="milliseconds")


def numeric_id() -> str:
    return str(10**18 + secrets.randbelow(8 * 10**18))


def fingerprint() -> str:
    return base64.b64encode(secrets.token_bytes(8)).decode()


class ApiError(GoogleError):
    """An HTTP error in the Compute API's JSON shape (with ``errors``); ``reason`` is ``errors[0].reason``."""

    def __init__(self, code: int, reason: str, message: str, domain: str = "global") -> None:
        error = {"message": message, "domain": domain, "reason": reason}
        super().__init__(code, message, errors=[error])
        self.reason, self.domain = reason, domain


def invalid(field: str, value: object, why: str) -> ApiError:
    return ApiError(400, "invalid", f"Invalid value for field '{field}': '{value}'. {why}")


def required(field: str) -> ApiError:
    return ApiError(400, "required", f"Required field '{field}' not specified")


def bad_request(message: str) -> ApiError:
    return ApiError(400, "badRequest", message)


def not_found(path: str) -> ApiError:
    return ApiError(404, "notFound", f"The resource '{path}' was not found")


# --- list filters and paging ------------------------------------------------------------------------

_TOKEN = re.compile(r'\s*(\(|\)|"(?:[^"\\]|\\.)*"|\'[^\']*\'|!=|=|:|[^\s()=!:"\']+)')


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text.rstrip()):
        m = _TOKEN.match(text, pos)
        if not m:
            raise invalid("filter", text, "Invalid list filter expression.")
        out.append(m.group(1))
        pos = m.end()
    return out


def _lookup(resource: dict[str, Any], field: str) -> Any:
    value: Any = resource
    for part in field.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _compare(resource: dict[str, Any], field: str, op: str, literal: str) -> bool:
    if literal[:1] in "\"'":
        literal = literal[1:-1]
    value = _lookup(resource, field)
    if op == ":":
        return value is not None and (literal == "*" or literal in _text(value))
    if op in ("eq", "ne"):
        hit = value is not None and re.fullmatch(literal, _text(value)) is not None
        return hit if op == "eq" else not hit
    hit = value is not None and _text(value) == literal
    return hit if op == "=" else not hit


def compile_filter(text: str | None) -> Any:
    """``filter`` of Compute list calls -> predicate. Supports ``field = v``, ``!=``, ``eq``/``ne`` (RE2
    full match), ``field:*`` (present), nested fields (``labels.k``, ``scheduling.preemptible``),
    parentheses, implicit or explicit AND, and OR."""
    if not text or not text.strip():
        return lambda resource: True
    toks = _tokens(text)
    pos = 0

    def expr() -> Any:
        nonlocal pos
        terms = [conj()]
        while pos < len(toks) and toks[pos].upper() == "OR":
            pos += 1
            terms.append(conj())
        return lambda r: any(t(r) for t in terms)

    def conj() -> Any:
        nonlocal pos
        terms = [term()]
        while pos < len(toks) and toks[pos] != ")" and toks[pos].upper() != "OR":
            if toks[pos].upper() == "AND":
                pos += 1
            terms.append(term())
        return lambda r: all(t(r) for t in terms)

    def term() -> Any:
        nonlocal pos
        if pos < len(toks) and toks[pos] == "(":
            pos += 1
            inner = expr()
            if pos >= len(toks) or toks[pos] != ")":
                raise invalid("filter", text, "Invalid list filter expression: unbalanced parentheses.")
            pos += 1
            return inner
        if pos + 3 > len(toks):
            raise invalid("filter", text, "Invalid list filter expression.")
        field, op, literal = toks[pos], toks[pos + 1], toks[pos + 2]
        if op not in ("=", "!=", ":", "eq", "ne"):
            raise invalid("filter", text, f"Invalid list filter expression: unsupported operator '{op}'.")
        pos += 3
        return lambda r: _compare(r, field, op, literal)

    predicate = expr()
    if pos != len(toks):
        raise invalid("filter", text, "Invalid list filter expression.")
    return predicate


def page(items: list[Any], max_results: str | None, page_token: str | None) -> tuple[list[Any], str | None]:
    """One page of ``items`` (``maxResults`` default and cap 500) and the next page's token, if any."""
    size = min(int(max_results or 500), 500)
    if size < 0:
        raise invalid("maxResults", max_results, "Must be between 0 and 500.")
    size = size or 500
    try:
        start = int(base64.urlsafe_b64decode(page_token.encode()).decode()) if page_token else 0
    except (ValueError, UnicodeDecodeError):
        raise invalid("pageToken", page_token, "Invalid page token.") from None
    end = start + size
    token = base64.urlsafe_b64encode(str(end).encode()).decode() if end < len(items) else None
    return items[start:end], token


def listing(kind: str, self_link: str, items: list[dict[str, Any]], args: Any) -> dict[str, Any]:
    """A list call's answer: ``items`` filtered (``filter``), sorted by name and paged (``maxResults``,
    ``pageToken``) as the request's query ``args`` ask."""
    items = sorted(filter(compile_filter(args.get("filter")), items), key=lambda r: r["name"])
    chunk, token = page(items, args.get("maxResults"), args.get("pageToken"))
    out: dict[str, Any] = {"kind": kind, "id": self_link.split("/compute/v1/", 1)[-1], "selfLink": self_link}
    if chunk:
        out["items"] = chunk
    if token:
        out["nextPageToken"] = token
    return out
