"""The training benchmarks' shared inputs: an ETL output (given, or a sample made on demand) and
the backbone's weights file."""
from __future__ import annotations

import argparse
import os


def add_arguments(parser: argparse.ArgumentParser, per_class: int, image_size: int) -> None:
    """``--data``, or ``--sample/--per-class/--image-size`` to make one; ``--weights``."""
    parser.add_argument("--data", default="", help="an ETL output; default: a sample through the ETL")
    parser.add_argument("--sample", default="fashion-mnist", choices=["fashion-mnist", "tuxpaint"])
    parser.add_argument("--per-class", type=positive_int, default=per_class, help="Fashion-MNIST images per class")
    parser.add_argument("--image-size", type=positive_int, default=image_size, help="ETL image size of the sample")
    parser.add_argument("--weights", default="", help="no-top Xception weights; default: the offline ImageNet file")


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, before anything starts (exit 2), a ``--data`` without an ETL manifest and a
    ``--weights`` file that does not exist."""
    if args.data and not os.path.isfile(os.path.join(args.data, "manifest.json")):
        parser.error(f"--data {args.data}: no manifest.json there (not an ETL output)")
    if args.weights and not os.path.isfile(args.weights):
        parser.error(f"--weights {args.weights}: no such file")


def prepare(args: argparse.Namespace, workdir: str) -> tuple:
    """``(ETL output folder, weights path)``: ``--data`` as given, or the sample through the ETL
    into ``workdir/data-<sample>-<per class>-<size>px`` (reused when already there)."""
    from pipelines.tools.workspace import ensure_sample_etl, ensure_weights

    data = args.data or ensure_sample_etl(
        os.path.join(workdir, f"data-{args.sample}-{args.per_class}-{args.image_size}px"),
        image_size=args.image_size, test_fraction=0.3, sample=args.sample, per_class=args.per_class)
    weights = os.path.abspath(args.weights) if args.weights else ensure_weights()
    return os.path.abspath(data), weights
