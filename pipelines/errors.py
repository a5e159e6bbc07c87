"""The one refusal type: bad input, known before (or instead of) the work.

A stage's command line and the notebooks turn :class:`Refused` (and only it) into exit code 2 and
one line naming what was refused; any other exception is a failure: exit 1 with its redacted
traceback on the failing rank and at the driver.
"""
from __future__ import annotations


class Refused(ValueError):
    """The input (options, data, an output folder, a model file) cannot be used as given.

    Raised where the input is checked; the message names the offending value or flag and what to
    do instead. A ``ValueError`` so that callers that caught ``ValueError`` before still do.
    """
