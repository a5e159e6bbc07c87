"""Both readers of a rank's shard as a pytest parameter: every data-path test runs against each
(``petastorm`` only where Petastorm 0.13.1 can run with the installed pyarrow)."""
import pytest

from pipelines.training.data import petastorm_available

READERS = [pytest.param("own", id="own"),
           pytest.param("petastorm", id="petastorm", marks=pytest.mark.skipif(
               not petastorm_available(), reason="Petastorm cannot run with this pyarrow"))]
