"""``python -m pipelines.predict IMAGE... --model MODEL``: see `pipelines.predict.local`."""
import sys

from pipelines.predict.local import main  # main sets the noise (--verbose) before TensorFlow loads

sys.exit(main())
