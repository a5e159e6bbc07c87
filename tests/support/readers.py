"""Both readers of a rank's shard as a pytest parameter: every data-path test runs against each
(``petastorm`` only on a stack that installs Petastorm: the table, :meth:`pipelines.stack.Stack.has`)."""
import pytest

from pipelines import stack

STACK = stack.active()
READERS = [pytest.param("own", id="own"),
           pytest.param("petastorm", id="petastorm", marks=pytest.mark.skipif(
               not STACK.has("petastorm"), reason=f"the {STACK.name} stack has no Petastorm"))]
