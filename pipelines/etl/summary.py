"""What the ETL reports once its output is committed: the summary a person reads, and its MLflow run."""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Dict, Iterator, Optional

from pipelines import tracking
from pipelines.contract import MANIFEST, SPLITS
from pipelines.etl.config import ETLConfig
from pipelines.etl.labels import SPLIT_RULE
from pipelines.etl.listing import display_path
from pipelines.io.storage import Location
from pipelines.manifest import Manifest, manifest_sha256
from pipelines.runtime.config import to_dict
from pipelines.runtime.logs import plural
from pipelines.runtime.redact import redact


def shown_config(config: ETLConfig) -> dict:
    """The config as the manifest and MLflow show it: names escaped, only the keys of ``--storage-option``."""
    return redact({**to_dict(config), "input": display_path(config.input), "output": display_path(config.output),
                   "storage_options": sorted(config.storage_options)})


def log_results(tracker, output: Location, manifest: dict) -> None:
    """Log the manifest's counts, sha256 and layout, and it and the rejected list as artifacts."""
    files = [output.join(MANIFEST), Manifest.from_dict(manifest).rejected_location(output)]
    with tempfile.TemporaryDirectory(prefix="etl-artifacts-") as tmp:
        local = [f.path if f.local else os.path.join(tmp, f.name) for f in files]
        for f, path in zip(files, local):
            f.download(path)
        tracker.log_results(manifest_metrics(manifest), {"manifest_sha256": manifest_sha256(output),
                                                         "layout": manifest.get("layout"), "run_id": manifest["run_id"]},
                            [(path, None) for path in local])


@contextlib.contextmanager
def track(config: ETLConfig) -> Iterator[Optional[object]]:
    """The ETL's MLflow run (``None`` with tracking off), the config as params, ended with the block."""
    if not config.tracking:
        yield None
        return

    params = shown_config(config)
    with tracking.start(config.tracking_uri, config.experiment, config.location(config.output), config.run_name,
                        params,
                        {"stage": "etl", "output": display_path(config.output)}) as tracker:
        yield tracker


def manifest_metrics(manifest: dict) -> Dict[str, float]:
    """The counts of a manifest as flat MLflow metrics (``files.<outcome>``, ``<split>.rows``, ...)."""
    metrics = {f"files.{key}": manifest["files"][key] for key in ("found", "written", "rejected", "skipped")}
    for split in SPLITS:
        metrics.update({f"{split}.{key}": manifest["splits"][split][key] for key in ("rows", "row_groups", "files")})
    metrics.update({key: manifest[key] for key in ("num_classes", "max_world_size", "seconds", "images_per_second")})
    return metrics


def format_summary(manifest: dict) -> str:
    """A short human summary of a manifest: counts, rejections, classes missing a split, look-alikes, speed."""
    files, splits = manifest["files"], manifest["splits"]
    lines = [
        f"ETL summary ({manifest['image']['height']} px, {plural(manifest['num_classes'], 'class')}, "
        f"{manifest.get('layout', 'caltech')} layout)",
        f"  found {files['found']} = written {files['written']} + rejected {files['rejected']} "
        f"+ skipped {files['skipped']}",
    ]
    for split in (name for name in SPLITS if name in splits):  # a format-2 manifest has no validation
        s = splits[split]
        lines.append(f"  {split:10s}: {plural(s['rows'], 'row')} in {plural(s['row_groups'], 'row group')} "
                     f"(~{s['mean_row_group_bytes'] / 2**20:.2f} MiB each, "
                     f"{s['mean_row_group_bytes_compressed'] / 2**20:.2f} MiB compressed)")
    lines.append(f"  max world size (row groups of the train split): {manifest['max_world_size']}")
    for reason, n in sorted(files["reasons"].items()):
        lines.append(f"  {n:6d} {reason}")
    if files["rejected"] + files["skipped"]:
        lines.append(f"  details: {files['list']}")
    small = manifest.get("classes_not_in_every_split", [])
    if small:
        shown = ", ".join(f"{c['label']} {c['name']!r} ({', '.join(f'{c.get(s, 0)} {s}' for s in SPLITS)})"
                          for c in small[:10])
        more = f" and {len(small) - 10} more (manifest: classes_not_in_every_split)" if len(small) > 10 else ""
        lines.append(f"  WARNING: {plural(len(small), 'class')} {'is' if len(small) == 1 else 'are'} not in every "
                     f"split ({manifest.get('split_rule', SPLIT_RULE)}): {shown}{more}")
    alike = manifest.get("look_alikes") or {}
    if alike.get("count"):
        shown = "; ".join(f"{a} ~ {b} ({bits} bits)" for a, b, bits in alike["pairs"][:10])
        more = f" and {alike['count'] - 10} more (manifest: look_alikes)" if alike["count"] > 10 else ""
        lines.append(f"  WARNING: {plural(alike['count'], 'pair')} of look-alike files kept, each split on its own "
                     f"(difference hashes within {alike['max_distance']} bits): {shown}{more}")
    hashing = f", {manifest['hash_seconds']} s of it hashing for duplicates" if manifest.get("hash_seconds") else ""
    lines.append(f"  {manifest['images_per_second']} images/s ({manifest['seconds']} s in Spark{hashing})")
    if manifest["max_world_size"] < manifest["min_row_groups"]:
        lines.append(f"  WARNING: the train split has fewer than {plural(manifest['min_row_groups'], 'row group')} "
                     "(--min-row-groups): too few rows for that many ranks")
    return "\n".join(lines)
