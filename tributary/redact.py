"""Keeping secrets out of what Tributary prints, logs and answers.

Every text that leaves the process and may carry a connection string or a driver's error
message (CLI output, log records, HTTP error bodies, status files) goes through :func:`redact`.
It masks, with :data:`MASK`:

- the password of any URL (``postgresql+psycopg://app:secret@db/x`` becomes
  ``postgresql+psycopg://app:***@db/x``, ``redis://:secret@cache`` ``redis://:***@cache``);
- the value of a password-like ``key=value`` (libpq's ``password=...``, librdkafka's
  ``sasl.password=...``) and of a ``Bearer`` credential;
- every value registered with :func:`register_secret` - the settings register their passwords
  and tokens when they are loaded, so a driver that echoes one in any form is caught too.

Values shorter than :data:`MIN_SECRET_LENGTH` are not registered (masking every ``a`` would
make messages unreadable); URL and ``key=value`` passwords are masked whatever their length.
"""

import logging
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

MASK = "***"
MIN_SECRET_LENGTH = 3

# scheme://user:password@host  (up to the last '@' before the path: an unencoded '@' in a
# password still ends up masked whole)
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)(?P<secret>[^\s/]+)@")
# password=..., sasl.password=..., "ssl.key.password": "...", client_secret=...
_KEY_VALUE = re.compile(
    r"(?P<head>(?P<q>[\"']?)[\w.-]*(?:password|passwd|secret)[\w.-]*(?P=q)\s*(?:=|:\s)\s*)"
    r"(?P<secret>\"[^\"]*\"|'[^']*'|[^\s,;&\"'}]+)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?P<head>\bBearer\s+)(?P<secret>[A-Za-z0-9._~+/=-]+)")

_known: set[str] = set()
_known_lock = threading.Lock()

T = TypeVar("T")


def register_secret(*values: str | None) -> None:
    """Mask these values wherever :func:`redact` sees them from now on (also their
    percent-decoded form, as drivers echo the decoded password of a URL)."""
    with _known_lock:
        for value in values:
            if not value:
                continue
            for form in {value, unquote(value)}:
                if len(form) >= MIN_SECRET_LENGTH:
                    _known.add(form)


def registered_secrets() -> frozenset[str]:
    with _known_lock:
        return frozenset(_known)


def url_password(url: str | None) -> str | None:
    """The password in a URL's user info, as written (None when it has none)."""
    if not url or "://" not in url:
        return None
    try:
        return urlsplit(url).password
    except ValueError:  # not a URL after all
        found = _URL_PASSWORD.search(url)
        return None if found is None else found.group("secret")


def redact_url(url: str) -> str:
    """The URL with its password masked (``postgresql://app:***@db/x``)."""
    return redact(url)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with URL passwords, password-like ``key=value`` pairs, bearer credentials,
    the registered secrets and ``secrets`` masked."""
    if not text:
        return text
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK + "@", text)
    text = _KEY_VALUE.sub(_mask_value, text)
    text = _BEARER.sub(lambda m: m.group("head") + MASK, text)
    values = registered_secrets() | {s for s in secrets if s}
    for value in sorted(values, key=len, reverse=True):  # longest first: no partial leftovers
        if value in text:
            text = text.replace(value, MASK)
    return text


def _mask_value(match: re.Match[str]) -> str:
    secret = match.group("secret")
    quote = secret[0] if secret[:1] in ("'", '"') else ""
    return f"{match.group('head')}{quote}{MASK}{quote}"


def redact_data(value: T) -> T:
    """``value`` with every string inside it (dict values and keys, lists, tuples) redacted,
    for JSON output."""
    return _redact_any(value)  # type: ignore[no-any-return]


def _redact_any(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {_redact_any(k): _redact_any(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_any(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_redact_any(v) for v in value)
    return value


# -- logging -----------------------------------------------------------------------------

_factory_lock = threading.Lock()
_installed = False


def redact_record(record: logging.LogRecord) -> logging.LogRecord:
    """Mask secrets in a log record's message, arguments, exception and stack text (the
    arguments keep their shape: formatters such as uvicorn's access log read them)."""
    if isinstance(record.msg, str):
        record.msg = redact(record.msg)
    if isinstance(record.args, tuple):
        record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
    elif isinstance(record.args, Mapping):
        record.args = {k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()}
    if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
        record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
    elif record.exc_text:
        record.exc_text = redact(record.exc_text)
    if record.stack_info:
        record.stack_info = redact(record.stack_info)
    return record


class RedactingFilter(logging.Filter):
    """A logging filter that masks secrets (for handlers configured elsewhere)."""

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        return True


def install_log_redaction() -> None:
    """Mask secrets in every log record this process creates, whichever logger and handler
    it goes through (wraps the log record factory; idempotent)."""
    global _installed
    with _factory_lock:
        if _installed:
            return
        make = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            return redact_record(make(*args, **kwargs))

        logging.setLogRecordFactory(factory)
        _installed = True
