"""Configuration of the training stage: ``TrainConfig``, one self-checking option group per concern.

Groups ``loader``, ``model``, ``fit``, ``compute``, ``outputs``, plus ``verbose`` and ``storage_options``.
Flags and keywords are the fields' names, flat (``TrainConfig(data=..., batch_size=8)``,
``dataclasses.replace``, ``to_dict``); code reads ``config.fit.batch_size``."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple, Union

from pipelines import tracking as trk
from pipelines.backbones import BACKBONES, DEFAULT_BACKBONE
from pipelines.io.options import storage_options_field
from pipelines.io.paths import check_url_safe
from pipelines.io.storage import check_not_root, is_local
from pipelines.runtime.checks import check_number, check_types
from pipelines.runtime.config import field, init_options, option_group, settle, settle_verbose, verbose_field
from pipelines.runtime.environment import TRACKING_ENV, read_settings
from pipelines.runtime.errors import Refused
from pipelines.training import stopping as rules
from pipelines.training.data import check_reader
from pipelines.training.data.augment import augmentation_names
from pipelines.training.data.rowcache import refuse_foreign
from pipelines.training.model.build import check_backbone
from pipelines.training.model.finetune import KERAS_GUIDE_LR_FACTOR, check_fine_tune

XLA_CHOICES = ("off", "on")  # --xla
HEAD_INITS = ("probe", "random")  # --head-init
#: ``--epochs``' default: a bound that early stopping, not the count, ends a run within (docs/training.md)
DEFAULT_EPOCHS = 200
#: ``--checkpoint-every-minutes``'s default: at most this much work is redone after a preemption
#: without a notice (a SIGTERM gets its own checkpoint at once); its cost: docs/benchmarks.md
DEFAULT_CHECKPOINT_MINUTES = 10.0


def profile_range(text: str) -> Union[int, Tuple[int, int]]:
    """``--profile-steps`` as ``profile_batch``: ``""`` -> 0, ``"A,B"`` -> ``(A, B)``, ``"A"`` -> ``(A, A)`` (1-based).

    Raises:
        ValueError: not one or two integers >= 1 with FIRST <= LAST.
    """
    if not text.strip():
        return 0
    parts = [p.strip() for p in text.split(",")]
    if len(parts) > 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise Refused(f"--profile-steps {text}: give FIRST,LAST training steps (integers >= 1), e.g. 10,15")
    first, last = int(parts[0]), int(parts[-1])
    if first > last:
        raise Refused(f"--profile-steps {text}: FIRST must not exceed LAST")
    return first, last


@dataclass(frozen=True)
class LoaderOptions:
    """loader: the ETL output (--data) and how each rank reads its shard"""

    data: str = field(help="ETL output (its manifest.json): a folder, file:// or a URI such as s3://bucket/etl")
    reader: str = field("",
                        help="how ranks read their shard: petastorm or own (pyarrow); default: the installed stack's")
    reader_workers: int = field(2, help="reader threads per rank of --reader own (petastorm always uses one)")
    cache_dir: str = field("", help="row-group cache root on local disk (a URI is refused); default: a "
                                    "temporary folder")
    shuffle_buffer: int = field(256, help="images in the shuffle buffer (uint8, before preprocessing)")
    augment: str = field("", const="flip", help="random ops on the training images, comma-separated, in order: flip, "
                                                "crop; bare: flip (turns --feature-cache off)")
    feature_cache: bool = field(False, help="compute the frozen backbone's features once (kept beside the data) "
                                            "and train only the head on them")

    def __post_init__(self) -> None:
        check_types(self)
        at_least(1, reader_workers=self.reader_workers, shuffle_buffer=self.shuffle_buffer)
        settle(self, augment=",".join(augmentation_names(self.augment)))
        data = local_or_uri(self.data)
        settle(self, reader=check_reader(self.reader), data=check_url_safe(data, "--data") if data and is_local(data)
               else data)
        if self.cache_dir and not is_local(self.cache_dir):
            raise Refused(f"--cache-dir {self.cache_dir}: Petastorm's cache is on each rank's local disk by "
                          "design; give a local folder (or none: a temporary one)")
        if self.cache_dir:
            settle(self, cache_dir=os.path.abspath(os.path.expanduser(self.cache_dir)))
            check_folder_path(self.cache_dir, "--cache-dir")
            refuse_foreign(self.cache_dir)  # another user's files are never read as a rank's cache

    @property
    def augmentations(self) -> Tuple[str, ...]:
        """The ops of ``--augment``, in the order they apply (``augment.AUGMENTATIONS``' names)."""
        return augmentation_names(self.augment)


@dataclass(frozen=True)
class ModelOptions:
    """model: the network, its weights and input side, fine-tuning"""

    backbone: str = field(DEFAULT_BACKBONE, help="frozen feature extractor, a row of pipelines/backbones.py (xception: "
                                           "the article's; tiny: random, with --weights none, for smoke tests)",
                          choices=tuple(BACKBONES))
    weights: str = field("imagenet", help="backbone weights: imagenet (Keras download), none (random), "
                                          "or the path of a no-top weights file")
    # the model's input side (input_size), named as its flag --image-size; the stored side is the data's
    image_size: int = field(0, help="side of the model's input in pixels; 0 = the ETL's size "
                                    "(a smaller size resizes on the fly)")
    dropout: float = field(0.5, help="dropout rate before the softmax head")
    head_init: str = field("probe", help="the head's first weights: probe (the linear probe's, on cached "
                                         "features) or random")
    fine_tune_blocks: int = field(0, help="after the head converges, unfreeze the backbone's top N blocks ("
                                          + ", ".join(f"{b.name} 1..{b.blocks}" for b in BACKBONES.values())
                                          + "); 0 = none")
    fine_tune_lr: float = field(KERAS_GUIDE_LR_FACTOR, help="fine-tuning's learning rate as a factor of "
                                "the head's, in (0, 1]")
    fine_tune_epochs: int = field(0, help="maximum epochs of the fine-tuning phase, with the same early stopping; "
                                          "0 = --epochs")

    def input_size(self, stored_size: int) -> int:
        """Side of the model's input in pixels: ``--image-size``, else the stored ``stored_size``."""
        return self.image_size or stored_size

    def __post_init__(self) -> None:
        check_types(self)
        check_number("dropout", self.dropout, at_least=0, below=1)
        if self.head_init not in HEAD_INITS:
            raise Refused(f"--head-init {self.head_init}: choose one of {', '.join(HEAD_INITS)}")
        at_least(0, image_size=self.image_size)
        # --fine-tune-lr: check_fine_tune's range (0, 1] refuses NaN and infinities too
        check_fine_tune(check_backbone(self.backbone, self.weights, self.image_size), self.fine_tune_blocks,
                        self.fine_tune_lr, self.fine_tune_epochs)
        if self.weights not in ("imagenet", "none"):
            settle(self, weights=os.path.abspath(os.path.expanduser(self.weights)))


@dataclass(frozen=True)
class FitOptions:
    """fit: epochs, batch, learning rate, warmup, early stopping, seed, checkpoint intervals"""

    epochs: int = field(DEFAULT_EPOCHS, help="maximum number of epochs (early stopping ends most runs before)")
    batch_size: int = field(16, help="images per step on each rank; the global batch is this x world size")
    base_lr: float = field(0.001, help="learning rate of one rank; scaled by the world size")
    weight_decay: float = field(0.0, help="Nadam's decoupled weight decay (>= 0; 0 = none)")
    warmup_epochs: float = field(0.0, help="epochs of linear warmup from base_lr to base_lr x world size")
    stopping: str = field("converge", help="early stopping's rule: converge (val_loss, patience in steps) or "
                                           "article (val_accuracy, in epochs)")
    monitor: str = field("", help="early stopping: the metric watched, val_loss or val_accuracy; default: "
                                  "the --stopping rule's")
    patience: Optional[int] = field(None, help="early stopping: at least this many epochs without a gain (>= 1); "
                                               "default: the --stopping rule's")
    patience_steps: Optional[int] = field(None, help="early stopping: steps without a gain (>= 0; 0: epochs only); "
                                                     "default: the --stopping rule's")
    min_delta: Optional[float] = field(None, help="early stopping: least change of --monitor that is a gain (>= 0); "
                                                  "default: the --stopping rule's")
    seed: int = field(42, help="seed of weights initialisation, shuffling and dropout")
    checkpoint_every_steps: Optional[int] = field(None, help="also checkpoint every N training steps (--resume continues "
                                                        "there exactly); default: by minutes only")
    checkpoint_every_minutes: Optional[float] = field(DEFAULT_CHECKPOINT_MINUTES, help="also checkpoint within an "
                                                      "epoch this many minutes after the last checkpoint")

    @property
    def rule(self) -> rules.StoppingRule:
        """Early stopping's rule: ``--stopping``'s, with the values given in place of its own."""
        return rules.StoppingRule(self.monitor, self.patience_steps, self.patience, self.min_delta)

    def __post_init__(self) -> None:
        check_types(self)
        at_least(1, epochs=self.epochs, batch_size=self.batch_size)
        check_number("base_lr", self.base_lr, above=0)
        check_number("weight_decay", self.weight_decay, at_least=0)
        check_number("warmup_epochs", self.warmup_epochs, at_least=0)
        # each value settled: the run's record (and so --resume) keeps the rule, not a default that may change.
        # No upper bound on min_delta: one above any possible gain keeps the first epoch's weights (the e2e tests')
        rule = rules.resolve(self.stopping, self.monitor, self.patience, self.patience_steps, self.min_delta)
        settle(self, monitor=rule.monitor, patience=rule.patience_epochs, patience_steps=rule.patience_steps,
               min_delta=rule.min_delta)
        interval = "an interval of steps or minutes between checkpoints"
        if self.checkpoint_every_steps is not None and not self.checkpoint_every_steps > 0:
            raise Refused(f"--checkpoint-every-steps must be positive, got {self.checkpoint_every_steps}: {interval}")
        if self.checkpoint_every_minutes is not None:  # None: by steps only (from Python; the flag takes a number)
            check_number("checkpoint_every_minutes", self.checkpoint_every_minutes, above=0, why=interval)


@dataclass(frozen=True)
class ComputeOptions:
    """compute: how each rank computes (threads, cores, precision, XLA, the allreduce's compression)"""

    threads: int = field(0, help="TensorFlow intra-op threads per rank; 0 = usable cores / local ranks")
    bind_cores: bool = field(False, help="bind each rank and its threads to --threads cores of its own (local "
                                         "ranks x threads <= cores)")
    fp16_allreduce: bool = field(False, help="allreduce gradients as float16: half the bytes on the wire; weights "
                                             "and update stay float32")
    mixed_precision: bool = field(False, help="Keras' mixed_float16 policy on a GPU (float16 compute, float32 "
                                              "weights); ignored on a CPU")
    xla: str = field("off", help="on: compile the model's forward and backward pass with XLA; off: not (default)")
    deterministic_ops: bool = field(False, help="TensorFlow's op determinism: the same seed, the same weights on "
                                                "a GPU too, at some speed")

    @property
    def xla_on(self) -> bool:
        """Whether ``--xla on``: the model's pass compiled by XLA."""
        return self.xla == "on"

    def __post_init__(self) -> None:
        check_types(self)
        at_least(0, threads=self.threads)
        if self.xla not in XLA_CHOICES:
            raise Refused(f"--xla {self.xla}: choose one of {', '.join(XLA_CHOICES)}")


@dataclass(frozen=True)
class OutputOptions:
    """outputs: --output, what a run may do with it, TensorBoard, MLflow"""

    output: str = field(help="folder or URI (s3://bucket/run) for checkpoints, logs, metrics.json and the final model")
    overwrite: bool = field(False, help="start afresh in an --output holding another run: delete that run's "
                                        "recorded files only")
    resume: bool = field(False, help="continue from the newest complete checkpoint in --output (refused if "
                                     "settings or data differ)")
    probe: bool = field(True, help="with --feature-cache, also fit and report a linear probe (logistic "
                                   "regression on the features)")
    tensorboard: bool = field(True, help="write TensorBoard logs on rank 0")
    pictures: bool = field(True, help="draw the curves, confusions and a contact sheet (PNG) into --output on rank 0")
    profile_steps: str = field("", help="FIRST,LAST: profile these training steps (1-based, across epochs) into "
                                        "TensorBoard; empty: none")
    tracking: Optional[bool] = field(None, help=trk.HELP["tracking"] + "; rank 0 logs one run per job")
    tracking_uri: str = field("", help=trk.HELP["tracking_uri"])
    experiment: str = field("pipelines-train", help=trk.HELP["experiment"])
    run_name: str = field("", help=trk.HELP["run_name"])
    register_model: str = field("", help="register the trained model in MLflow's model registry under this name")

    @property
    def profile_batch(self) -> Union[int, Tuple[int, int]]:
        """Keras' ``TensorBoard(profile_batch=...)`` for ``--profile-steps``: 0 (none) or ``(first, last)``."""
        return profile_range(self.profile_steps)

    def __post_init__(self) -> None:
        check_types(self)
        profile_range(self.profile_steps)
        if self.profile_steps and not self.tensorboard:
            raise Refused("--profile-steps writes into the TensorBoard logs: drop --no-tensorboard")
        if self.resume and self.overwrite:
            raise Refused("--resume continues the run in --output, --overwrite replaces it: give one of them")
        settle(self, output=local_or_uri(self.output))
        check_not_root(self.output, "--output")  # a run prunes its checkpoints there
        # here, in the launching process: tracking's defaults from the environment
        settle(self, **dict(zip(("tracking", "tracking_uri"), trk.resolve(
            self.tracking, self.tracking_uri, self.output, self.experiment, read_settings()))))
        if self.register_model and not self.tracking:
            raise Refused(f"--register-model needs tracking: drop --no-tracking (or {TRACKING_ENV}=0)")
        if self.register_model:  # else only the registry would refuse it, after the whole training
            trk.check_model_name(self.register_model, self.tracking_uri)


@dataclass(frozen=True, init=False)
class TrainConfig:
    """Horovod + Petastorm + Keras Xception transfer learning on the ETL's Parquet output.

    Built from flat keywords; a group given whole (``fit=FitOptions(...)``) is overridden by its fields'.

    Raises:
        TypeError: an unknown keyword, no ``data``/``output``, or a whole group of the wrong class.
        pipelines.runtime.errors.Refused: a value of the wrong type, or one a group's checks refuse.
    """

    loader: LoaderOptions = option_group(LoaderOptions.__doc__)
    model: ModelOptions = option_group(ModelOptions.__doc__)
    fit: FitOptions = option_group(FitOptions.__doc__)
    compute: ComputeOptions = option_group(ComputeOptions.__doc__)
    outputs: OutputOptions = option_group(OutputOptions.__doc__)
    verbose: Optional[bool] = verbose_field("TensorFlow's info lines")
    storage_options: Dict[str, str] = storage_options_field()

    def __init__(self, **options: Any) -> None:
        init_options(self, options)

    def __post_init__(self) -> None:
        # here, in the launching process: the ranks get it in the config
        settle(self, verbose=settle_verbose(self.verbose, read_settings()))

    @property
    def fine_tune_max_epochs(self) -> int:
        """Maximum epochs of the fine-tuning phase: ``--fine-tune-epochs``, or ``--epochs``."""
        return self.model.fine_tune_epochs or self.fit.epochs


def at_least(bound: int, **options: int) -> None:
    """Refuse each int option (name=value) below ``bound``, naming its flag (NaN is refused too).

    Raises:
        pipelines.runtime.errors.Refused: ``--NAME must be >= BOUND, got VALUE``.
    """
    for name, value in options.items():
        if not value >= bound:  # asked this way round, a NaN is refused too
            raise Refused(f"--{name.replace('_', '-')} must be >= {bound}, got {value}")


def check_folder_path(path: str, option: str) -> None:
    """Refuse a local ``path`` that cannot become a folder (it or its nearest existing part is a file).

    Raises:
        ValueError: naming ``option``, the path and the file in the way.
    """
    existing = path
    while not os.path.lexists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        what = "is a file" if existing == path else f"lies under the file {existing}"
        raise Refused(f"{option} {path} {what}: give a folder (made if missing)")


def local_or_uri(value: str) -> str:
    """A local path made absolute (``file://`` stripped), a URI as given without trailing ``/``.

    The URI is checked later, where the run is planned, so that only rank 0 reports it."""
    if is_local(value):
        path = value[len("file://"):] if value.startswith("file://") else value
        return os.path.abspath(os.path.expanduser(path))
    return value.rstrip("/")
