"""The top k of a few image files, in this process (no Spark), resolved and decoded as the job does.

``python -m pipelines.predict IMAGE... --model MODEL``."""
from __future__ import annotations

import argparse
import dataclasses
import tempfile
from typing import Dict, List, Optional, Sequence

from pipelines.predict.config import PredictConfig
from pipelines.predict.infer import PREDICTED, UNREADABLE, make_decoder, predict_columns
from pipelines.predict.model import ModelSpec, resolve_model
from pipelines.runtime.config import add_arguments, settle_verbose
from pipelines.runtime.environment import read_settings
from pipelines.runtime.errors import exit_status
from pipelines.runtime.logs import setup_logging
from pipelines.runtime.quiet import quiet_by_default

OPTIONS = ("model", "top_k", "class_names", "max_file_mb", "batch_size", "verbose")


def predict_files(paths: Sequence[str], spec: ModelSpec, top_k: int = 3, max_file_bytes: int = 50 * 2**20,
                  batch_size: int = 32) -> List[Dict]:
    """Predict image files in this process, ``batch_size`` at a time: one dict of the job's columns per path."""
    model = spec.load()
    decode = make_decoder(True, spec.image_size, max_file_bytes)
    rows = []
    for start in range(0, len(paths), batch_size):
        chunk = list(paths[start:start + batch_size])
        columns = predict_columns(model, chunk, None, decode, top_k, spec.class_names)
        for i, path in enumerate(chunk):
            ok = columns["reason"][i] is None
            rows.append({"path": path, "status": PREDICTED if ok else UNREADABLE, "reason": columns["reason"][i],
                         **{name: columns[name][i].tolist() if ok else None
                            for name in ("top_labels", "top_names", "top_probabilities")}})
    return rows


def format_row(row: Dict) -> str:
    """``path: name 0.912, name 0.051`` or ``path: unreadable: reason``."""
    if row["status"] != PREDICTED:
        return f"{row['path']}: unreadable: {row['reason']}"
    return f"{row['path']}: " + ", ".join(f"{name} {p:.3f}" for name, p in zip(row["top_names"],
                                                                              row["top_probabilities"]))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print the top k of each file; return 0, 1 if a file was unreadable or on an error, 2 on a `Refused`."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.predict", description=__doc__.split("\n")[0])
    parser.add_argument("images", nargs="+", help="image files")
    defaults = {f.name: f.default for f in dataclasses.fields(PredictConfig)}
    add_arguments(parser, PredictConfig, {name: defaults[name] for name in OPTIONS})
    args = parser.parse_args(argv)
    if args.top_k < 1 or args.batch_size < 1 or not args.max_file_mb > 0:
        parser.error("--top-k and --batch-size must be >= 1, --max-file-mb positive")
    quiet_by_default(settle_verbose(args.verbose, read_settings()))  # before TensorFlow loads
    log = setup_logging("predict")
    with tempfile.TemporaryDirectory(prefix="model-") as download:
        try:
            spec = resolve_model(args.model, args.class_names, download)
            rows = predict_files(args.images, spec, args.top_k, int(args.max_file_mb * 2**20), args.batch_size)
        except Exception as exc:  # noqa: BLE001 - a refusal is 2, anything else 1 with its traceback
            return exit_status(exc, log)
    for row in rows:
        print(format_row(row))
    return 1 if any(row["status"] != PREDICTED for row in rows) else 0
