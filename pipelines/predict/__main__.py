"""``python -m pipelines.predict IMAGE... --model MODEL``: see :mod:`pipelines.predict.local`."""
import sys

from pipelines.quiet import quiet_by_default

quiet_by_default()  # before TensorFlow loads: warnings only, unless --verbose
from pipelines.predict.local import main  # noqa: E402

sys.exit(main())
