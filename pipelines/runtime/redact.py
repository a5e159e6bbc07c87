"""Secrets masked wherever a config, URI, option or message is written or printed (standard library only).

A secret-looking key's value and a URI's userinfo become ``MASK``; when in doubt, mask."""
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
    """Whether the value of ``key`` (dict key, option, query parameter, variable name) may be a secret.

    True for ``secret_key``, ``AWS_SECRET_ACCESS_KEY``, ``X-Amz-Signature``, ``key``, ``AccountKey``, ``PGPASSWORD``,
    ``--token``, ``-Dfs.s3a.secret.key``; False for ``endpoint_override``, ``tracking_uri``, ``cache_key``."""
    words = [w for w in _WORD_SPLIT.split(_HUMP.sub("_", str(key)).lower()) if w]
    if not words:
        return False
    if words == ["key"] or words[0] in ("connection", "conn") and "string" in words:
        return True
    if any(w in _SECRET_WORDS or w.endswith(_SECRET_ENDINGS) for w in words):
        return True
    return any(w == "key" and i > 0 and words[i - 1] in _KEY_OWNERS for i, w in enumerate(words))


def _spark_regex() -> str:
    """``SPARK_REDACTION_REGEX``, made from the words ``is_secret_key`` reads."""
    short = sorted(w for w in _SECRET_WORDS if len(w) <= 4) + ["key"]  # words only where alone: sig, not signal
    return ("(?i)" + "|".join(sorted(w for w in _SECRET_WORDS | set(_SECRET_ENDINGS) if len(w) > 4))
            + "|(" + "|".join(sorted(_KEY_OWNERS)) + ")[._-]?key|conn(ection)?[._-]?string"
            + "|(?<![a-z0-9])(" + "|".join(short) + ")(?![a-z0-9])")


#: The rule as Spark's ``spark.redaction.regex`` (case-insensitive, searched in every property's key and
#: value, hiding the whole value), which ``spark_session`` sets: Spark's default misses ``account_key``, a bare
#: ``key``, ``sig``, ``credentials``. It matches substrings, so it hides more than ``is_secret_key``.
SPARK_REDACTION_REGEX = _spark_regex()


def redact_uri(uri: str) -> str:
    """``uri`` with its userinfo (found by parsing, so a password holding ``@`` goes whole) and secret query values masked.

    >>> redact_uri("http://alice:hunter2@mlflow.example:5000/x?X-Amz-Signature=abc&a=1")
    'http://***@mlflow.example:5000/x?X-Amz-Signature=***&a=1'"""
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
    """``text`` with every URI's userinfo and secret-looking key's value masked (percent-encoded ones decoded)."""
    return _ENCODED.sub(_encoded, _redact_plain(text))


def _redact_plain(text: str) -> str:
    """``redact_text`` without the percent-decoding."""
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
    """One percent-encoded run: as is unless decoding it (up to three times) shows a secret, else decoded and masked."""
    decoded = m.group(0)
    for _ in range(3):
        once = unquote(decoded)
        if once == decoded:
            break
        decoded = once
    shown = _redact_plain(decoded)
    return m.group(0) if shown == decoded else shown


def _key_value(m: "re.Match[str]") -> str:
    """One ``key=value`` match: a secret key's value masked, a plain key's value searched again (it may hold a pair)."""
    dashes, key, separator, value = m.groups()
    if is_secret_key(key):
        return dashes + key + separator + MASK
    return dashes + key + separator + _KEY_VALUE.sub(_key_value, value)


def redact(value: Any) -> Any:
    """A copy of ``value`` (nested dicts, lists, tuples, strings, bytes) with secret-looking keys' values masked
    (a dict's, a ``(key, value)`` tuple's, the item after a secret flag); keys and empty values kept.

    >>> redact({"storage_options": {"secret_key": "S3CR3T", "region": "eu"}, "tracking_uri": "http://a:b@h"})
    {'storage_options': {'secret_key': '***', 'region': 'eu'}, 'tracking_uri': 'http://***@h'}"""
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
    """Whether list ``item`` names a secret the next item holds: a secret key first in a pair, or a secret flag."""
    if isinstance(item, bytes):
        item = item.decode("utf-8", "replace")
    return isinstance(item, str) and (pair or item.startswith("-")) and is_secret_key(item)
