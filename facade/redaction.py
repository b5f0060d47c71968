"""Secrets out of ``repr``, error messages, logs and command output: the one place that decides.

A secret is the value of a setting whose name says so (``sasl.password``,
``basic.auth.user.info``, ``sasl.jaas.config``, ``sasl.oauthbearer.client.secret``...), the
password of a URL, and a URL query value whose name says so (``?password=``). Everything
else (hosts, ports, user names, databases) stays readable, so messages still say where.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, unquote

__all__ = [
    "MASK",
    "config_secrets",
    "is_secret",
    "redact",
    "redact_text",
    "redact_url",
    "url_secrets",
]

#: What a secret is replaced with.
MASK = "***"

_SECRET_NAME = re.compile(
    r"password|passwd|secret|token(?!\.endpoint)|credential|user\.info|jaas|oauthbearer\.config|ssl\.key"
    r"|key\.pem|private",
    re.IGNORECASE,
)
_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*://"
#: A comma before another ``scheme://`` separates URLs (a registry's URL list).
_URL_LIST = re.compile(rf"(,\s*)(?={_SCHEME})")
_URL_IN_TEXT = re.compile(rf"{_SCHEME}\S+")
_QUERY_ITEM = re.compile(r"([?&])([^=&#]+)=([^&#]*)")


def is_secret(name: object) -> bool:
    """Whether a setting (or URL query parameter) named ``name`` holds a secret."""
    return _SECRET_NAME.search(str(name)) is not None


def redact(config: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of ``config`` with secret values masked and URL values redacted."""
    return {
        key: MASK
        if is_secret(key)
        else redact_url(value)
        if isinstance(value, str) and "://" in value
        else value
        for key, value in config.items()
    }


def redact_url(url: str) -> str:
    """Return ``url`` (or a comma-separated list of URLs) without passwords.

    The password and every secret query value become ``***``; scheme, user, host, port, path
    and other query values stay. What counts as the password is the widest reading of the
    parsers that consume these URLs, so no part of it survives under either:
    ``sqlalchemy.make_url`` reads from the user's ``:`` to the next ``@``, over ``/``, ``:``,
    ``?`` and ``#``; ``urllib.parse.urlsplit`` (and HTTP clients) read to the last ``@``
    before the path, over ``@`` and ``:``.
    """
    parts = _URL_LIST.split(url)
    return "".join(part if i % 2 else _redact_one(part) for i, part in enumerate(parts))


def url_secrets(url: str) -> list[str]:
    """The secret parts of ``url`` as written (password, secret query values), for
    ``redact_text``."""
    found: list[str] = []
    for i, part in enumerate(_URL_LIST.split(url)):
        if i % 2 == 0:
            found.extend(_split(part)[1])
    return found


def config_secrets(config: Mapping[str, Any]) -> list[str]:
    """The secret values of ``config`` (and the password of a ``user:password`` value)."""
    found: list[str] = []
    for key, value in config.items():
        if is_secret(key) and value is not None and not callable(value):
            text = str(value)
            found.append(text)
            user, colon, password = text.partition(":")
            if colon and user and password and " " not in text:
                found.append(password)
        elif isinstance(value, str) and "://" in value:
            found.extend(url_secrets(value))
    return found


def redact_text(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Return ``text`` with each of ``secrets`` masked (as written, percent-decoded or
    percent-encoded) and every URL in it redacted: for messages quoting a driver or server."""
    variants = {v for s in secrets if s for v in (s, unquote(s), quote(s, safe="")) if v}
    for secret in sorted(variants, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return _URL_IN_TEXT.sub(lambda match: redact_url(match.group()), text)


def _redact_one(url: str) -> str:
    (head, rest), _ = _split(url)
    return head + rest


def _split(url: str) -> tuple[tuple[str, str], list[str]]:
    """``url`` redacted as (``scheme://user:***@``, the rest), and the secrets it held."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return (url, ""), []
    head, secrets = scheme + sep, []
    at = _user_info_end(rest)
    if at >= 0:
        user, colon, password = rest[:at].partition(":")
        if colon:
            head += f"{user}:{MASK}@"
            rest = rest[at + 1 :]
            secrets.append(password)

    def query_item(match: re.Match[str]) -> str:
        lead, name, value = match.groups()
        if not is_secret(unquote(name)) or not value:
            return match.group()
        secrets.append(value)
        return f"{lead}{name}={MASK}"

    query = rest.find("?")
    if query >= 0:
        rest = rest[:query] + _QUERY_ITEM.sub(query_item, rest[query:])
    return (head, rest), secrets


def _user_info_end(rest: str) -> int:
    """The index of the ``@`` ending the user info of ``rest`` (after ``://``), or -1."""
    if rest.startswith("/"):
        return -1  # no authority (sqlite:////path)
    # urllib.parse: the authority ends at the first "/", "?" or "#"; user info at its last "@".
    authority_end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    by_urllib = rest.rfind("@", 0, authority_end)
    # SQLAlchemy: a user name runs to ":" or "/"; after ":", the password runs to the next "@".
    name_end = re.search(r"[:/@]", rest)
    by_sqlalchemy = rest.find("@", name_end.start()) if name_end and name_end.group() == ":" else -1
    return max(by_urllib, by_sqlalchemy)
