"""What the linear probe costs at a size: seconds of ``fit_probe`` on synthetic features.

The probe (:mod:`pipelines.training.probe`) fits a multinomial logistic regression whose every
L-BFGS iteration costs about ``4 x rows x features x classes`` floating-point operations (the
scores and the gradient), so its seconds grow with rows and classes alike. This benchmark times one
``C`` at ``--rows`` x ``--features`` x ``--classes`` (Gaussian classes, the seed fixed) for
``--max-iter`` iterations, with ``--threads`` BLAS threads, and prints the seconds per iteration
and their extrapolation to ``--target-rows`` rows and ``--target-classes`` classes (linear in
each), then to the probe's bound there: its capped rows and at most ``max_iter`` iterations for
each of the grid's values (docs/training.md, "The linear probe"). Accuracy beside the model:
``benchmarks/seed_accuracy.py``.

Usage: python benchmarks/probe_cost.py [--rows 3000] [--features 2048] [--classes 257] [--max-iter 10]
           [--threads 1] [--target-rows 30000] [--target-classes 257]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np


def synthetic(rows: int, features: int, classes: int, seed: int = 0):
    """``rows`` non-negative features (as pooled ReLU outputs are) around ``classes`` centres:
    float32 ``(rows, features)`` and int32 labels ``(rows,)``."""
    rng = np.random.default_rng(seed)
    labels = np.arange(rows) % classes
    centres = rng.gamma(1.0, 1.0, size=(classes, features)).astype(np.float32)
    noise = rng.gamma(1.0, 1.0, size=(rows, features)).astype(np.float32)
    return centres[labels] + noise, labels.astype(np.int32)


def main(argv=None) -> int:
    from pipelines.training.probe import DEFAULT_GRID, DEFAULT_MAX_ITER, DEFAULT_MAX_ROWS, fit_probe

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--features", type=int, default=2048)
    parser.add_argument("--classes", type=int, default=257)
    parser.add_argument("--max-iter", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads (0: the libraries' own)")
    parser.add_argument("--target-rows", type=int, default=30000)
    parser.add_argument("--target-classes", type=int, default=257)
    args = parser.parse_args(argv)
    for name in ("rows", "features", "classes", "max_iter", "target_rows", "target_classes"):
        if getattr(args, name) < 1 or (name == "classes" and args.classes < 2):
            parser.error(f"--{name.replace('_', '-')} must be >= {2 if name == 'classes' else 1}, "
                         f"got {getattr(args, name)}")
    x, y = synthetic(args.rows, args.features, args.classes)
    vx, vy = synthetic(max(args.classes, args.rows // 4), args.features, args.classes, seed=1)
    found = fit_probe(x, y, vx, vy, grid=(1.0,), max_iter=args.max_iter, max_rows=args.rows,
                      threads=args.threads or None)
    iterations = max(1, found["grid"][0]["iterations"])
    per_iteration = found["seconds"] / iterations
    fitted = min(args.target_rows, DEFAULT_MAX_ROWS)
    scale = fitted / args.rows * args.target_classes / args.classes
    print(f"{args.rows} rows x {args.features} features x {args.classes} classes, {args.threads or 'all'} "
          f"thread(s): {found['seconds']:.1f} s for {iterations} iterations of one C, {per_iteration:.3f} s an "
          f"iteration (scaling and scoring included)")
    print(f"at {args.target_rows} rows ({fitted} fitted, the cap {DEFAULT_MAX_ROWS}) x {args.target_classes} "
          f"classes: about {per_iteration * scale:.2f} s an iteration; at most {DEFAULT_MAX_ITER} iterations x "
          f"{len(DEFAULT_GRID)} values of C = {per_iteration * scale * DEFAULT_MAX_ITER * len(DEFAULT_GRID):.0f} s "
          f"(the bound; warm starts make the later values cost a fraction)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
