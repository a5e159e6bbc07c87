"""The training benchmarks' shared inputs: an ETL output (given, or a sample made on demand), the
backbone's weights file, and the training settings as one :class:`TrainConfig`.

Training settings are ``TrainConfig``'s own options (same names, help and checks as
``jobs/train.py``), with each benchmark's defaults. The sample's ETL size is ``--etl-image-size``:
``--image-size`` is ``TrainConfig``'s, the side of the model's input (0 = the ETL's size).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any, Dict

WEIGHTS_NOTE = "; default: the ImageNet file converted offline (pipelines.tools.weights)"


def add_arguments(parser: argparse.ArgumentParser, per_class: int, etl_image_size: int,
                  training: Dict[str, Any]) -> None:
    """``--data``, or ``--sample/--per-class/--etl-image-size`` to make one; ``--weights`` and the
    ``TrainConfig`` options named in ``training`` (field name: this benchmark's default, ``None`` for
    ``TrainConfig``'s)."""
    from pipelines.runtime.config import add_arguments as add_config_arguments, option_fields
    from pipelines.training.config import TrainConfig

    fields = {f.name: f.default for _, f, _ in option_fields(TrainConfig)}
    training = {name: fields[name] if default is None else default for name, default in training.items()}

    parser.add_argument("--data", default="", help="an ETL output; default: a sample through the ETL")
    parser.add_argument("--sample", default="fashion-mnist", choices=["fashion-mnist", "tuxpaint"])
    parser.add_argument("--per-class", type=positive_int, default=per_class, help="Fashion-MNIST images per class")
    parser.add_argument("--etl-image-size", type=positive_int, default=etl_image_size,
                        help="image size the ETL stores the sample at")
    add_config_arguments(parser, TrainConfig, {**training, "weights": ""}, notes={"weights": WEIGHTS_NOTE})


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def check(parser: argparse.ArgumentParser, args: argparse.Namespace, training: Dict[str, Any], **fixed):
    """The base :class:`TrainConfig`: the options named in ``training`` plus ``fixed`` fields (its data
    and weights are filled in by :func:`prepare`). Refuses, before anything starts (exit 2), what
    ``TrainConfig`` refuses, a ``--data`` without an ETL manifest and a ``--weights`` file that does
    not exist."""
    from pipelines.training.config import TrainConfig

    if args.data and not os.path.isfile(os.path.join(args.data, "manifest.json")):
        parser.error(f"--data {args.data}: no manifest.json there (not an ETL output)")
    if args.weights not in ("", "imagenet", "none") and not os.path.isfile(args.weights):
        parser.error(f"--weights {args.weights}: no such file")
    try:  # data and weights stand in until prepare() knows them
        return TrainConfig(data=os.curdir, weights="none", **{name: getattr(args, name) for name in training},
                           **fixed)
    except ValueError as exc:
        parser.error(str(exc))


def prepare(base, args: argparse.Namespace, workdir: str):
    """``base`` with its data and weights: ``--data`` as given, or the sample through the ETL into
    ``workdir/data-<sample>-<per class>-<size>px`` (reused when already there); ``--weights`` as
    given, or the backbone's default (``tools.workspace.ensure_weights``)."""
    from pipelines.tools.workspace import ensure_sample_etl, ensure_weights

    data = args.data or ensure_sample_etl(
        os.path.join(workdir, f"data-{args.sample}-{args.per_class}-{args.etl_image_size}px"),
        image_size=args.etl_image_size, test_fraction=0.3, sample=args.sample, per_class=args.per_class)
    weights = ensure_weights(args.weights, base.model.backbone)
    return dataclasses.replace(base, data=os.path.abspath(data), weights=weights)
