"""Configuration of the search (``jobs/tune.py``): `TuneConfig`, one flag per field."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Optional

from pipelines import tracking as trk
from pipelines.backbones import BACKBONES, DEFAULT_BACKBONE
from pipelines.io.options import storage_options_field
from pipelines.io.storage import is_local
from pipelines.runtime.checks import check_types
from pipelines.runtime.config import field, settle, settle_verbose, verbose_field
from pipelines.runtime.environment import read_settings
from pipelines.runtime.errors import Refused
from pipelines.training.config import HEAD_INITS, at_least, check_folder_path, local_or_uri
from pipelines.training.model.build import check_backbone
from pipelines.training.stopping import RULES
from pipelines.tune.space import SearchSpace, parse_range

#: ``--runner``: how trials reach Spark (`runners`).
RUNNERS = ("auto", "mlflow-spark", "ask-tell")


@dataclass(frozen=True)
class TuneConfig:
    """Search the head's settings on cached features: Optuna trials as Spark tasks, each an MLflow child run.

    Raises `Refused`, naming the flag: a value of another type, a count below 1, a bad range, an unknown name.
    """

    data: str = field(help="ETL output whose feature cache (made by jobs/train.py --feature-cache) the trials read")
    output: str = field(help="local folder for the search's record (tune.json) and, by default, its MLflow store")
    backbone: str = field(DEFAULT_BACKBONE, help="backbone the features were computed with", choices=tuple(BACKBONES))
    weights: str = field("imagenet", help="weights the features were computed with: imagenet, none (random, "
                                          "seeded by --seed) or a file path")
    image_size: int = field(0, help="the backbone's input side the features were computed at; 0 = the ETL's size")
    trials: int = field(16, help="trials in all (each trains the head once)")
    parallel: int = field(0, help="trials run at once, one Spark task each; 0 = Spark's default parallelism")
    base_lr_range: str = field("0.0001,0.01", help="LOW,HIGH of --base-lr (one rank's learning rate), log scale")
    dropout_range: str = field("0.0,0.7", help="LOW,HIGH of --dropout, in [0, 1)")
    weight_decay_range: str = field("0.00001,0.1", help="LOW,HIGH of --weight-decay (Nadam's decoupled "
                                                        "decay), log scale")
    patience_steps_range: str = field("25,400", help="LOW,HIGH of --patience-steps (early stopping's "
                                                     "patience in steps), integers")
    stopping: str = field("converge", help="early-stopping rule of every trial, converge or article (its patience "
                                           "is searched)")
    head_init: str = field("probe", help="every trial's first head: probe (the linear probe's, fitted once) or "
                                         "random, as jobs/train.py's --head-init", choices=HEAD_INITS)
    epochs: int = field(200, help="maximum epochs of a trial")
    batch_size: int = field(16, help="rows per step of one rank, as jobs/train.py's --batch-size")
    ranks: int = field(1, help="world size the settings are for: a trial steps batch-size x ranks rows "
                               "at base-lr x ranks")
    seed: int = field(42, help="seed of the sampler and of every trial's weights, dropout and shuffling")
    threads: int = field(1, help="TensorFlow threads per trial (a Spark task)")
    runner: str = field("auto", help="how trials reach Spark: mlflow-spark (MLflow 3), ask-tell, or auto "
                                     "(mlflow-spark where it exists)", choices=RUNNERS)
    master: Optional[str] = field(None, help="Spark master when not set by spark-submit (default local[*])")
    tracking_uri: str = field("", help=trk.HELP["tracking_uri"])
    experiment: str = field("pipelines-tune", help=trk.HELP["experiment"])
    run_name: str = field("", help="the search's MLflow run (its trials are child runs); default: tune-<time>")
    verbose: Optional[bool] = verbose_field("Spark's and TensorFlow's info lines")
    storage_options: Dict[str, str] = storage_options_field()

    def __post_init__(self) -> None:
        check_types(self)
        at_least(1, trials=self.trials, epochs=self.epochs, batch_size=self.batch_size, ranks=self.ranks)
        at_least(0, parallel=self.parallel, image_size=self.image_size, threads=self.threads)
        self.space()  # each range refused here, before Spark starts
        if self.stopping not in RULES:
            raise Refused(f"--stopping {self.stopping}: choose one of {', '.join(RULES)}")
        if self.head_init not in HEAD_INITS:
            raise Refused(f"--head-init {self.head_init}: choose one of {', '.join(HEAD_INITS)}")
        if self.runner not in RUNNERS:
            raise Refused(f"--runner {self.runner}: choose one of {', '.join(RUNNERS)}")
        check_backbone(self.backbone, self.weights, self.image_size)
        if self.weights not in ("imagenet", "none"):
            settle(self, weights=os.path.abspath(os.path.expanduser(self.weights)))
        if not is_local(self.output):
            raise Refused(f"--output {self.output}: give a local folder (the search's record and default store)")
        settle(self, data=local_or_uri(self.data), output=local_or_uri(self.output))
        check_folder_path(self.output, "--output")
        _, uri = trk.resolve(True, self.tracking_uri, self.output, self.experiment, read_settings())
        settle(self, tracking_uri=uri, verbose=settle_verbose(self.verbose, read_settings()))

    def space(self) -> SearchSpace:
        """The ranges of the flags as a `SearchSpace`; raises `Refused` as `parse_range`."""
        return SearchSpace(
            base_lr=parse_range("--base-lr-range", self.base_lr_range, at_least=0, log=True),
            dropout=parse_range("--dropout-range", self.dropout_range, at_least=0, below=1),
            weight_decay=parse_range("--weight-decay-range", self.weight_decay_range, at_least=0, log=True),
            patience_steps=parse_range("--patience-steps-range", self.patience_steps_range, at_least=0, integer=True))
