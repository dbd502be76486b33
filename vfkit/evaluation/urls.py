"""Base URLs as vf-eval takes them: checked where they enter, and shown without their password.

    check_base_url("localhost:8000/v1", "-b/--api-base-url")   # ConfigError: no http(s) scheme
    redact_url("http://me:s3cret@host:8000/v1")                 # 'http://me:***@host:8000/v1'
    is_openai_api("https://api.openai.com/v1")                  # True: OPENAI_API_KEY belongs
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from vfkit.errors import ConfigError

OPENAI_API_HOST = "api.openai.com"
REDACTED = "***"  # what a password becomes
# "scheme://user:password@" anywhere in a text: the password part is replaced
_USERINFO_RE = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^\s/]*@")


def redact_text(text: str) -> str:
    """`text` with every URL password replaced by REDACTED (for errors, logs and metadata)."""
    return _USERINFO_RE.sub(rf"\g<head>{REDACTED}@", text)


def redact_url(url: str) -> str:
    """The URL with its password (if any) replaced by REDACTED."""
    return redact_text(url)


def has_password(url: str) -> bool:
    """True when the URL carries a `user:password@` part."""
    try:
        return urlsplit(url).password is not None
    except ValueError:
        return False


def check_base_url(url: str, where: str) -> str:
    """`url` when it is an http(s) URL with a host; else a ConfigError naming `where`."""
    if not isinstance(url, str):
        raise ConfigError(f"{where}: expected a URL string, got {url!r}")
    shown = redact_url(url)
    try:
        parts = urlsplit(url.strip())
        _ = parts.port  # a non-numeric port raises here
    except ValueError as exc:
        raise ConfigError(f"{where}: {shown!r} is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"{where}: {shown!r} is not an http(s) URL; write it with its scheme and host, "
            "e.g. http://127.0.0.1:8000/v1"
        )
    return url.strip()


def is_openai_api(url: str) -> bool:
    """True when `url` is the OpenAI API itself (the only place OPENAI_API_KEY goes unasked)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.scheme == "https" and (parts.hostname or "").lower() == OPENAI_API_HOST
