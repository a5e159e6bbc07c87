"""Secrets masked wherever a config, URI, option or message is written or printed.

One rule for the whole product (pure, standard library only):

- a **secret-looking key** (:func:`is_secret_key`: ``secret_key``, ``session_token``, ``password``,
  ``access_key``, ``aws_secret_access_key``, ``sas_token``, ``account_key``, ``credentials``,
  ``X-Amz-Signature``, s3fs' ``key``/``secret``/``token`` ...) keeps its key, its value becomes
  :data:`MASK`;
- a **URI's userinfo** is masked (``http://alice:hunter2@host`` -> ``http://***@host``), and so are
  the values of its secret-looking query parameters (``?X-Amz-Signature=...``, ``?password=...``);
- **free text** (an exception's message, a traceback, a dataclass' repr) gets both rules, for the
  URIs, ``key=value`` and ``key<TAB>value`` pairs, ``'key': 'value'`` items (``bytes`` values too:
  ``b'value'``) and ``('key', 'value')`` tuples (``Location.options``, ``dict.items()``) it holds,
  and a bare ``Bearer`` token is masked wherever it stands;
- **objects**: the values of a dict's secret-looking keys, of a ``(key, value)`` tuple's and of a
  flag's following item in a list, and ``bytes`` as text (:func:`redact`).

Keys are matched on their words (split at ``_ - .``, space and CamelCase humps, lower case), so
``cache_key`` or ``tracking_uri`` stay readable while every spelling of a credential is masked:
``SecretAccessKey``, ``AccountKey``, ``PGPASSWORD`` (a word ending in a secret word), a flag
(``--password=V``, ``--token V``, ``['--token', 'V']``), a JVM property (``-Dfs.s3a.secret.key=V``),
a value starting with ``/`` (base64 signatures do) and a percent-encoded one
(``password%3Dhunter2``, ``https%3A%2F%2Falice%3Apw%40host``: decoded, then masked). The rule errs on the
side of masking: a masked setting costs a reader one value; a leaked one costs a credential.
"""
from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

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
# Secret words that also end a word glued to a prefix: PGPASSWORD, DBPASSWD, GHTOKEN, APPSECRET.
_SECRET_ENDINGS = ("password", "passwd", "passphrase", "secret", "token", "credentials", "signature", "apikey",
                   "accesskey", "secretkey")
_WORD_SPLIT = re.compile(r"[^a-z0-9]+")
# CamelCase humps: SecretAccessKey -> Secret Access Key, AWSSecretKey -> AWS Secret Key
_HUMP = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def is_secret_key(key: Any) -> bool:
    """Whether the value of ``key`` (a dict key, option name, query parameter or environment
    variable name) may be a secret. ``"secret_key"``, ``"AWS_SECRET_ACCESS_KEY"``,
    ``"session-token"``, ``"X-Amz-Signature"``, ``"key"`` -> ``True``; ``"endpoint_override"``,
    ``"tracking_uri"``, ``"cache_key"`` -> ``False``; ``"SecretAccessKey"``, ``"AccountKey"``,
    ``"PGPASSWORD"``, ``"--token"``, ``"-Dfs.s3a.secret.key"`` -> ``True``."""
    words = [w for w in _WORD_SPLIT.split(_HUMP.sub("_", str(key)).lower()) if w]
    if not words:
        return False
    if words == ["key"] or words[0] in ("connection", "conn") and "string" in words:
        return True
    if any(w in _SECRET_WORDS or w.endswith(_SECRET_ENDINGS) for w in words):
        return True
    return any(w == "key" and i > 0 and words[i - 1] in _KEY_OWNERS for i, w in enumerate(words))


def _spark_regex() -> str:
    """:data:`SPARK_REDACTION_REGEX`, made from the words :func:`is_secret_key` reads."""
    short = sorted(w for w in _SECRET_WORDS if len(w) <= 4) + ["key"]  # words only where alone: sig, not signal
    return ("(?i)" + "|".join(sorted(w for w in _SECRET_WORDS | set(_SECRET_ENDINGS) if len(w) > 4))
            + "|(" + "|".join(sorted(_KEY_OWNERS)) + ")[._-]?key|conn(ection)?[._-]?string"
            + "|(?<![a-z0-9])(" + "|".join(short) + ")(?![a-z0-9])")


#: The same rule as Spark's ``spark.redaction.regex`` (a Java regex, case-insensitive, searched in
#: every property's key and value: the whole value is hidden where it matches), which hides what
#: its UI and event logs show of the configuration, the environment and ``sun.java.command`` (a
#: ``spark-submit`` command line). Spark's own default (``secret|password|token|access[.]?key``)
#: misses ``account_key``, a bare ``key``, ``sig``, ``credentials``; :func:`pipelines.runtime.spark.spark_session`
#: sets this one. It matches words as substrings, so it hides more than :func:`is_secret_key`
#: (``cache_key`` too): a hidden setting in the UI costs a reader one value.
SPARK_REDACTION_REGEX = _spark_regex()


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
# space or a quote, an HTTP scheme word before it included ("Authorization: Bearer xyz"); the key
# may be a flag (--password=V) or a JVM property (-Dfs.s3a.secret.key=V), whose -D is not its word
_KEY_VALUE = re.compile(r"(?<![\w\-.])((?:-D|--?)?)([A-Za-z][\w\-.]*)(\s*[=:]\s*|[ ]*\t\s*)(?![\s'\"{\[(]|b['\"])"
                        r"((?:(?:Bearer|Basic|Token)\s+)?[^\s&?#,;'\"}\])]+)")
# a flag and its value as two words of a command line (--token V), or two items of an argv list
_FLAG_VALUE = re.compile(r"(?<![\w\-.])(--?[A-Za-z][\w\-.]*)(\s+)(?![\s\-'\"])([^\s'\"]+)")
_FLAG_ITEM = re.compile(r"""(['"])(--?[A-Za-z][\w\-.]*)\1(\s*,\s*)(['"])((?:(?!\4)[^\\\n]|\\.)*)\4""")
# a run of text holding percent-escapes (a URL-encoded query, a URI inside a query value)
# (from a run's start only: a search from every character of a long run would take its square)
_ENCODED = re.compile(r"(?<![^\s'\"<>])[^\s'\"<>]*%[0-9A-Fa-f]{2}[^\s'\"<>]*")
# 'key': 'value' and "key": "value" items (a dict's repr, JSON)
_QUOTED_ITEM = re.compile(r"""(b?(['"]))([^'"\n]{1,100})\2(\s*:\s*)(b?(['"]))((?:(?!\6)[^\\\n]|\\.)*)\6""")
# ('key', 'value'): a pair as a tuple (Location.options, dict.items()); a list of two is a sequence,
# such as the names of a config's storage options (["access_key", "secret_key"])
_PAIR_ITEM = re.compile(r"""(\(\s*)(b?(['"]))([^'"\n]{1,100})\3(\s*,\s*)(b?(['"]))((?:(?!\7)[^\\\n]|\\.)*)\7(?=\s*\))""")
# key='value', key: "value" (a dataclass' repr, YAML)
_KEYWORD_ITEM = re.compile(r"""(?<![\w\-.])([A-Za-z][\w\-.]*)(\s*[=:]\s*)(b?(['"]))((?:(?!\4)[^\\\n]|\\.)*)\4""")
# a bearer token on its own (an HTTP client's message): at least 8 token characters, one of them a
# digit or punctuation, so that "bearer of" or "Bearer realm" read as words
_BEARER = re.compile(r"(?i)(?<![\w\-])(bearer)(\s+)(?=[\w\-.~+/]*[\d\-.~+/])([\w\-.~+/]{8,}=*)")


def redact_text(text: str) -> str:
    """``text`` (a message, traceback, command line or repr) with every URI's userinfo and every
    value of a secret-looking key masked: ``scheme://user:pass@`` -> ``scheme://***@``;
    ``secret_key=V``, ``password: V``, ``'session_token': 'V'``, ``token="V"``, ``--token V``,
    ``-Dfs.s3a.secret.key=V`` -> the value :data:`MASK`. A percent-encoded run that hides one of
    these is shown decoded, with the secret masked (``password%3Dpw`` -> ``password=***``)."""
    return _ENCODED.sub(_encoded, _redact_plain(text))


def _redact_plain(text: str) -> str:
    """:func:`redact_text` without the percent-decoding."""
    text = _USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)
    text = _QUOTED_ITEM.sub(lambda m: m.group(0) if not is_secret_key(m.group(3)) else
                            f"{m.group(1)}{m.group(3)}{m.group(2)}{m.group(4)}{m.group(5)}{MASK}{m.group(6)}", text)
    text = _PAIR_ITEM.sub(lambda m: m.group(0) if not is_secret_key(m.group(4)) else
                          f"{m.group(1)}{m.group(2)}{m.group(4)}{m.group(3)}{m.group(5)}{m.group(6)}{MASK}{m.group(7)}",
                          text)
    text = _FLAG_ITEM.sub(lambda m: m.group(0) if not is_secret_key(m.group(2)) else
                          f"{m.group(1)}{m.group(2)}{m.group(1)}{m.group(3)}{m.group(4)}{MASK}{m.group(4)}", text)
    text = _KEYWORD_ITEM.sub(lambda m: m.group(0) if not is_secret_key(m.group(1)) else
                             f"{m.group(1)}{m.group(2)}{m.group(3)}{MASK}{m.group(4)}", text)
    text = _FLAG_VALUE.sub(lambda m: m.group(0) if not is_secret_key(m.group(1)) or m.group(3) == MASK else
                           m.group(1) + m.group(2) + MASK, text)
    return _BEARER.sub(lambda m: m.group(1) + m.group(2) + MASK, _KEY_VALUE.sub(_key_value, text))


def _encoded(m: "re.Match[str]") -> str:
    """One percent-encoded run of :func:`redact_text`: as it is unless decoding it (up to three
    times: a URI inside a query value inside a URL) shows a secret, else decoded and masked."""
    decoded = m.group(0)
    for _ in range(3):
        once = unquote(decoded)
        if once == decoded:
            break
        decoded = once
    shown = _redact_plain(decoded)
    return m.group(0) if shown == decoded else shown


def _key_value(m: "re.Match[str]") -> str:
    """One ``key=value`` / ``key: value`` of :func:`redact_text`: a secret key's value masked; a
    plain key's value searched again, as it may hold a pair of its own (``why: secret_key=V``, an
    exception's message quoted after its type or a label)."""
    dashes, key, separator, value = m.groups()
    if is_secret_key(key):
        return dashes + key + separator + MASK
    return dashes + key + separator + _KEY_VALUE.sub(_key_value, value)


def redact(value: Any) -> Any:
    """``value`` (a config dict, options, params, a report: dicts, lists, tuples, strings, bytes,
    numbers) with the values of secret-looking keys masked (keys kept; empty values kept, they hide
    nothing): a dict's, a ``(key, value)`` tuple's (``Location.options``), and the item after a
    secret-looking flag in a list (an argv); every string and ``bytes`` through :func:`redact_text`.
    Returns a new object; ``value`` is not changed.

    >>> redact({"storage_options": {"secret_key": "S3CR3T", "region": "eu"}, "tracking_uri": "http://a:b@h"})
    {'storage_options': {'secret_key': '***', 'region': 'eu'}, 'tracking_uri': 'http://***@h'}
    >>> redact((("endpoint_override", "http://h:9000"), ("secret_key", "S3CR3T")))
    (('endpoint_override', 'http://h:9000'), ('secret_key', '***'))
    """
    if isinstance(value, dict):
        return {key: MASK if is_secret_key(key) and item not in _EMPTY else redact(item)
                for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = list(value)
        pair = isinstance(value, tuple) and len(items) == 2
        return type(value)(MASK if i and _names_secret(items[i - 1], pair) and item not in _EMPTY
                           else redact(item) for i, item in enumerate(items))
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, bytes):
        return redact_text(value.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
    return value


_EMPTY: tuple = (None, "", b"", {}, [], ())


def _names_secret(item: Any, pair: bool) -> bool:
    """Whether ``item`` of a list or tuple names a secret the next item holds: a secret-looking key
    as the first of a pair (a tuple of two), or a secret-looking flag (``--token``) anywhere."""
    if isinstance(item, bytes):
        item = item.decode("utf-8", "replace")
    return isinstance(item, str) and (pair or item.startswith("-")) and is_secret_key(item)
