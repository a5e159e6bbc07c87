"""Secrets masked wherever a config, URI, option or message is written or printed.

One rule for the whole product (pure, standard library only):

- a **secret-looking key** (:func:`is_secret_key`: ``secret_key``, ``session_token``, ``password``,
  ``access_key``, ``aws_secret_access_key``, ``sas_token``, ``account_key``, ``credentials``,
  ``X-Amz-Signature``, s3fs' ``key``/``secret``/``token`` ...) keeps its key, its value becomes
  :data:`MASK`;
- a **URI's userinfo** is masked (``http://alice:hunter2@host`` -> ``http://***@host``), and so are
  the values of its secret-looking query parameters (``?X-Amz-Signature=...``, ``?password=...``);
- **free text** (an exception's message, a traceback, a dataclass' repr) gets both rules, for the
  URIs, ``key=value`` pairs and ``'key': 'value'`` items it holds.

Keys are matched on their words (lower case, split at ``_ - .`` and space), so ``cache_key`` or
``tracking_uri`` stay readable while every spelling of a credential is masked. The rule errs on the
side of masking: a masked setting costs a reader one value; a leaked one costs a credential.
"""
from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

MASK = "***"

# Words that name a secret wherever they appear in a key.
_SECRET_WORDS = frozenset({
    "secret", "secrets", "password", "passwd", "passphrase", "pwd", "pass", "token", "tokens", "credential",
    "credentials", "creds", "signature", "sig", "auth", "authorization", "cookie", "sas", "apikey", "accesskey",
    "secretkey", "privatekey", "connectionstring"})
# Words that name a secret when "key" (or "id" after "key") follows them: access_key, aws_access_key_id,
# account_key, api_key, private_key; a bare "key" is s3fs' access key.
_KEY_OWNERS = frozenset({"access", "account", "api", "private", "client", "master", "shared", "storage",
                         "encryption", "customer", "signing", "sse", "secret", "session"})
_WORD_SPLIT = re.compile(r"[^a-z0-9]+")


def is_secret_key(key: Any) -> bool:
    """Whether the value of ``key`` (a dict key, option name, query parameter or environment
    variable name) may be a secret. ``"secret_key"``, ``"AWS_SECRET_ACCESS_KEY"``,
    ``"session-token"``, ``"X-Amz-Signature"``, ``"key"`` -> ``True``; ``"endpoint_override"``,
    ``"tracking_uri"``, ``"cache_key"`` -> ``False``."""
    words = [w for w in _WORD_SPLIT.split(str(key).lower()) if w]
    if not words:
        return False
    if words == ["key"] or words[0] in ("connection", "conn") and "string" in words:
        return True
    if any(w in _SECRET_WORDS for w in words):
        return True
    return any(w == "key" and i > 0 and words[i - 1] in _KEY_OWNERS for i, w in enumerate(words))


def redact_uri(uri: str) -> str:
    """``uri`` with its userinfo and the values of its secret-looking query parameters masked
    (the userinfo is found by parsing, so a password holding ``@`` is masked whole; the rest
    through :func:`redact_text`).

    >>> redact_uri("http://alice:hunter2@mlflow.example:5000/x?X-Amz-Signature=abc&a=1")
    'http://***@mlflow.example:5000/x?X-Amz-Signature=***&a=1'
    """
    try:
        parts = urlsplit(uri)
    except ValueError:  # an unbalanced IPv6 bracket, say: the text rules still apply
        return redact_text(uri)
    if parts.scheme and "://" in uri and "@" in parts.netloc:
        uri = urlunsplit((parts.scheme, MASK + "@" + parts.netloc.rsplit("@", 1)[1], parts.path, parts.query,
                          parts.fragment))
    return redact_text(uri)


# scheme://userinfo@ in free text (userinfo: up to the last @ before a slash, space or quote)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s'\"<>]+@")
# key=value and key: value (a query string, a command line, a log line): the value up to & ? # , ;
# space or a quote, an HTTP scheme word before it included ("Authorization: Bearer xyz")
_KEY_VALUE = re.compile(r"(?<![\w\-.])([A-Za-z][\w\-.]*)(\s*[=:]\s*)(?![\s'\"{\[(/])"
                        r"((?:(?:Bearer|Basic|Token)\s+)?[^\s&?#,;'\"}\])]+)")
# 'key': 'value' and "key": "value" items (a dict's repr, JSON)
_QUOTED_ITEM = re.compile(r"""(['"])([^'"\n]{1,100})\1(\s*:\s*)(['"])((?:(?!\4)[^\\\n]|\\.)*)\4""")
# key='value', key: "value" (a dataclass' repr, YAML)
_KEYWORD_ITEM = re.compile(r"""(?<![\w\-.])([A-Za-z][\w\-.]*)(\s*[=:]\s*)(['"])((?:(?!\3)[^\\\n]|\\.)*)\3""")


def redact_text(text: str) -> str:
    """``text`` (a message, traceback or repr) with every URI's userinfo and every value of a
    secret-looking key masked: ``scheme://user:pass@`` -> ``scheme://***@``; ``secret_key=V``,
    ``password: V``, ``'session_token': 'V'``, ``token="V"`` -> the value :data:`MASK`."""
    text = _USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)
    text = _QUOTED_ITEM.sub(lambda m: m.group(0) if not is_secret_key(m.group(2)) else
                            f"{m.group(1)}{m.group(2)}{m.group(1)}{m.group(3)}{m.group(4)}{MASK}{m.group(4)}", text)
    text = _KEYWORD_ITEM.sub(lambda m: m.group(0) if not is_secret_key(m.group(1)) else
                             f"{m.group(1)}{m.group(2)}{m.group(3)}{MASK}{m.group(3)}", text)
    return _KEY_VALUE.sub(_key_value, text)


def _key_value(m: "re.Match[str]") -> str:
    """One ``key=value`` / ``key: value`` of :func:`redact_text`: a secret key's value masked; a
    plain key's value searched again, as it may hold a pair of its own (``why: secret_key=V``, an
    exception's message quoted after its type or a label)."""
    key, separator, value = m.groups()
    if is_secret_key(key):
        return key + separator + MASK
    return key + separator + _KEY_VALUE.sub(_key_value, value)


def redact(value: Any) -> Any:
    """``value`` (a config dict, options, params, a report: dicts, lists, tuples, strings, numbers)
    with the values of secret-looking keys masked (keys kept; empty values kept, they hide nothing)
    and every string through :func:`redact_text`. Returns a new object; ``value`` is not changed.

    >>> redact({"storage_options": {"secret_key": "S3CR3T", "region": "eu"}, "tracking_uri": "http://a:b@h"})
    {'storage_options': {'secret_key': '***', 'region': 'eu'}, 'tracking_uri': 'http://***@h'}
    """
    if isinstance(value, dict):
        return {key: MASK if is_secret_key(key) and item not in (None, "", {}, [], ()) else redact(item)
                for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(item) for item in value)
    if isinstance(value, str):
        return redact_text(value)
    return value
