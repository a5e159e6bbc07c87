"""The scaling model on paper: bytes allreduced per step, ring-allreduce time over a link, predicted
scaling efficiency at 8, 64 and 512 GPUs, and the loader throughput each GPU needs.

Pure arithmetic, no TensorFlow: it prints the tables of ``docs/scaling-model.md`` so that every
number there can be reproduced (``python benchmarks/scaling_model.py``), and fits the model to one
run of your own (``--fit-*``).

Sources:
- Xception's layers (Chollet 2017, arXiv:1610.02357) as Keras builds them
  (``keras/applications/xception.py``): :data:`XCEPTION_BLOCKS`. The parameter counts follow from the
  layer shapes; Keras' model (``Xception(weights=None, include_top=False)``) has 20,861,480
  parameters, 54,528 of them the batch norms' moving statistics (``tests/unit/benchmarks/test_scaling_model.py``
  checks both, and the top-N-block counts against the training job's own ``finetune.unfreeze``).
- Ring allreduce (Sergeev & Del Balso 2018, "Horovod: fast and easy distributed deep learning in
  TensorFlow", arXiv:1802.05799, after Patarasuk & Yuan 2009): each of N ranks sends and receives
  ``2 (N - 1) / N x bytes``, so the time is ``2 (N - 1) / N x bytes / bandwidth`` (+ ``2 (N - 1)``
  latencies, :func:`ring_allreduce_seconds`).
- Horovod's published efficiency: 90 % for Inception V3 and ResNet-101 (68 % for VGG-16) on 512
  GPUs, 128 servers with 4 Pascal GPUs each, RoCE 25 Gbit/s (Horovod's README and docs/benchmarks).
- Xception's forward pass on one GPU: keras.io/api/applications lists 8.1 ms per inference step on
  a GPU (a Tesla A100, batch 32, per that page's footnote): about 3,950 images/s. An ASSUMPTION for
  your GPU: replace it with your own measurement (``scripts/gpu_check.py``, ``--forward-images-per-second``).

Usage: python benchmarks/scaling_model.py [--classes 257] [--batch-size 32] [--image-size 299]
           [--forward-images-per-second 3950] [--step-overhead-ms 1] [--gpus-per-host 8] [--markdown]
       python benchmarks/scaling_model.py --fit-np N --fit-step-ms MS --fit-allreduce-ms MS --fit-bytes B
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Dict, Iterable, List, Sequence, Tuple

# Nominal one-direction rates, bytes/s: what a GPU (or a host's NIC) can send while it receives as much.
GB = 1e9
LINKS: Dict[str, float] = {
    "NVLink 3 (A100, NVSwitch)": 300 * GB,   # 600 GB/s both directions per GPU (NVIDIA A100 datasheet)
    "NVLink 4 (H100, NVSwitch)": 450 * GB,   # 900 GB/s both directions per GPU (NVIDIA H100 datasheet)
    "PCIe 4.0 x16": 32 * GB,                 # 16 GT/s x 16 lanes, 128b/130b: 31.5 GB/s
    "PCIe 5.0 x16": 64 * GB,                 # 32 GT/s: 63 GB/s
    "25 Gb Ethernet": 25e9 / 8,
    "100 Gb Ethernet / InfiniBand EDR": 100e9 / 8,
    "200 Gb Ethernet / InfiniBand HDR": 200e9 / 8,
    "400 Gb Ethernet / InfiniBand NDR": 400e9 / 8,
}
INTRA_HOST = ["NVLink 4 (H100, NVSwitch)", "NVLink 3 (A100, NVSwitch)", "PCIe 5.0 x16", "PCIe 4.0 x16"]
INTER_HOST = ["25 Gb Ethernet", "100 Gb Ethernet / InfiniBand EDR", "200 Gb Ethernet / InfiniBand HDR",
              "400 Gb Ethernet / InfiniBand NDR"]
FEATURES = 2048            # Xception's pooled features: the head's input
FORWARD_IMAGES_PER_SECOND = 1000 * 32 / 8.1   # the ASSUMPTION above: 3,950 images/s


@dataclass(frozen=True)
class Layer:
    """One weighted layer: ``kind`` 'conv' (k x k, no bias), 'sep' (3 x 3 depthwise then 1 x 1
    pointwise, no bias) or 'bn' (gamma and beta train; moving mean and variance do not), ``cin``
    input and ``cout`` output channels, ``side`` the output's height and width in pixels."""

    block: int
    kind: str
    k: int
    cin: int
    cout: int
    side: int

    @property
    def trainable(self) -> int:
        """Trainable scalars (a batch norm's gamma and beta, or the kernels)."""
        if self.kind == "bn":
            return 2 * self.cout
        if self.kind == "sep":
            return self.k * self.k * self.cin + self.cin * self.cout
        return self.k * self.k * self.cin * self.cout

    @property
    def non_trainable(self) -> int:
        """A batch norm's moving mean and variance; 0 for a convolution."""
        return 2 * self.cout if self.kind == "bn" else 0

    @property
    def macs(self) -> int:
        """Multiply-accumulates of one image's forward pass (batch norms counted as 0)."""
        if self.kind == "bn":
            return 0
        return self.side * self.side * self.trainable


def _half(side: int) -> int:
    """A stride-2 'same' convolution or pooling: ceil(side / 2)."""
    return (side + 1) // 2


def xception_layers(image_size: int = 299) -> List[Layer]:
    """Xception's weighted layers in Keras' order, for a square input of ``image_size`` px (>= 71).

    Entry flow: block 1 (two 3 x 3 convolutions, 32 and 64 filters, the first with stride 2, both
    'valid'); blocks 2-4 (two separable convolutions to 128, 256, 728, then 3 x 3 max pooling with
    stride 2, beside a 1 x 1 stride-2 residual convolution with its batch norm). Middle flow:
    blocks 5-12 (three 728 -> 728 separable convolutions). Exit flow: block 13 (728 -> 728 -> 1024,
    pooling, residual 1 x 1 to 1024), block 14 (1024 -> 1536 -> 2048, no residual).
    Every convolution is followed by a batch norm. Raises ``ValueError`` below 71 px."""
    if image_size < 71:
        raise ValueError(f"Xception takes images of at least 71 px, got {image_size}")
    layers: List[Layer] = []

    def conv(block, kind, k, cin, cout, side):
        layers.extend([Layer(block, kind, k, cin, cout, side), Layer(block, "bn", 0, cout, cout, side)])

    side = (image_size - 3) // 2 + 1
    conv(1, "conv", 3, 3, 32, side)
    side -= 2
    conv(1, "conv", 3, 32, 64, side)
    cin = 64
    for block, (first, second) in ((2, (128, 128)), (3, (256, 256)), (4, (728, 728)), (13, (728, 1024))):
        if block == 13:  # the middle flow comes before it, at block 4's output size
            for middle in range(5, 13):
                for _ in range(3):
                    conv(middle, "sep", 3, 728, 728, side)
        conv(block, "conv", 1, cin, second, _half(side))  # the residual branch
        conv(block, "sep", 3, cin, first, side)
        conv(block, "sep", 3, first, second, side)
        side, cin = _half(side), second
    conv(14, "sep", 3, 1024, 1536, side)
    conv(14, "sep", 3, 1536, 2048, side)
    return layers


def block_totals(layers: Sequence[Layer]) -> Dict[int, Tuple[int, int]]:
    """Per block: (trainable parameters, forward MACs per image)."""
    totals: Dict[int, Tuple[int, int]] = {}
    for layer in layers:
        params, macs = totals.get(layer.block, (0, 0))
        totals[layer.block] = (params + layer.trainable, macs + layer.macs)
    return totals


def top_blocks(layers: Sequence[Layer], blocks: int) -> Tuple[int, float]:
    """The top ``blocks`` blocks (14 = the whole backbone): their trainable parameters, and their
    share of the backbone's forward MACs (0..1)."""
    totals = block_totals(layers)
    top = [b for b in totals if b > 14 - blocks]
    all_macs = sum(m for _, m in totals.values())
    return sum(totals[b][0] for b in top), sum(totals[b][1] for b in top) / all_macs


def head_parameters(classes: int, features: int = FEATURES) -> int:
    """The softmax head's parameters: ``features x classes`` weights + ``classes`` biases."""
    return features * classes + classes


def allreduce_bytes(parameters: int, fp16: bool) -> int:
    """Bytes a rank allreduces per step: one gradient per trainable parameter, 4 bytes (float32) or 2
    (``--fp16-allreduce``)."""
    return parameters * (2 if fp16 else 4)


def ring_allreduce_seconds(nbytes: float, ranks: int, bandwidth: float, latency: float = 0.0) -> float:
    """Ring allreduce of ``nbytes`` over ``ranks`` ranks on links of ``bandwidth`` bytes/s each way:
    ``2 (N - 1) / N x nbytes / bandwidth + 2 (N - 1) x latency`` (Sergeev & Del Balso 2018). One rank
    sends nothing (0 s). Raises ``ValueError`` for ``ranks < 1`` or a bandwidth <= 0."""
    if ranks < 1 or bandwidth <= 0:
        raise ValueError(f"need ranks >= 1 and bandwidth > 0, got {ranks} and {bandwidth}")
    return 2 * (ranks - 1) / ranks * nbytes / bandwidth + 2 * (ranks - 1) * latency


def efficiency(compute_seconds: float, allreduce_seconds: float) -> float:
    """Scaling efficiency when the allreduce does not overlap compute (a lower bound: Horovod starts
    allreducing gradients while the backward pass still runs): ``compute / (compute + allreduce)``."""
    return compute_seconds / (compute_seconds + allreduce_seconds)


@dataclass(frozen=True)
class Mode:
    """A way to train: its trainable ``parameters`` (allreduced each step) and its per-image
    compute in units of one backbone forward pass (``forward_passes``; 0 for the feature cache,
    whose steps run only the head)."""

    name: str
    parameters: int
    forward_passes: float


def modes(classes: int, image_size: int = 299) -> List[Mode]:
    """Frozen backbone, feature cache, fine-tuning the top 2 blocks, and all 14. Fine-tuning adds the
    backward pass of the unfrozen blocks, about twice their forward MACs (gradients for the inputs
    and for the weights)."""
    layers = xception_layers(image_size)
    head = head_parameters(classes)
    two, two_share = top_blocks(layers, 2)
    all_, _ = top_blocks(layers, 14)
    return [Mode("frozen backbone (head only)", head, 1.0),
            Mode("feature cache (head only)", head, 0.0),
            Mode("fine-tune top 2 blocks", two + head, 1.0 + 2 * two_share),
            Mode("fine-tune all 14 blocks", all_ + head, 3.0)]


def step_compute_seconds(mode: Mode, batch_size: int, forward_images_per_second: float,
                         overhead_seconds: float) -> float:
    """One rank's compute per step: ``batch x forward_passes / forward rate + overhead``."""
    return batch_size * mode.forward_passes / forward_images_per_second + overhead_seconds


def predict(mode: Mode, ranks: int, link: str, fp16: bool, batch_size: int, forward_images_per_second: float,
            overhead_seconds: float) -> Dict[str, float]:
    """One prediction: compute and allreduce seconds per step, efficiency, and the images/s each
    GPU's loader must deliver at that step time."""
    compute = step_compute_seconds(mode, batch_size, forward_images_per_second, overhead_seconds)
    comm = ring_allreduce_seconds(allreduce_bytes(mode.parameters, fp16), ranks, LINKS[link])
    return {"compute_s": compute, "allreduce_s": comm, "efficiency": efficiency(compute, comm),
            "images_per_second_per_gpu": batch_size / (compute + comm)}


def fit(ranks: int, step_seconds: float, allreduce_seconds: float, nbytes: float) -> Dict[str, float]:
    """Fit the model to one run of ``ranks`` ranks: its measured step time and allreduce time per step
    (Horovod's timeline, ``ALLREDUCE`` phase) and the bytes allreduced per step give the link's
    effective bandwidth and the compute per step (``step - allreduce``, assuming no overlap).
    Raises ``ValueError`` when ``ranks < 2`` or the times are not ``0 < allreduce < step``."""
    if ranks < 2 or not 0 < allreduce_seconds < step_seconds:
        raise ValueError(f"need ranks >= 2 and 0 < allreduce < step, got {ranks}, {allreduce_seconds}, {step_seconds}")
    return {"bandwidth": 2 * (ranks - 1) / ranks * nbytes / allreduce_seconds,
            "compute_s": step_seconds - allreduce_seconds}


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def parameter_table(classes: int, image_size: int) -> str:
    """Parameters, bytes per step and forward share of each mode."""
    layers = xception_layers(image_size)
    rows = []
    for n in (1, 2, 14):
        params, share = top_blocks(layers, n)
        rows.append((f"top {n} block{'s' if n > 1 else ''} of the backbone", f"{params:,}",
                     f"{100 * share:.1f} %", "", ""))
    for m in modes(classes, image_size):
        rows.append((m.name, f"{m.parameters:,}", "", f"{allreduce_bytes(m.parameters, False) / 1e6:.2f}",
                     f"{allreduce_bytes(m.parameters, True) / 1e6:.2f}"))
    return _table(["what trains", "trainable parameters", "share of forward MACs", "MB per step, fp32",
                   "MB per step, fp16"], rows)


def efficiency_table(classes: int, ranks: int, links: Sequence[str], batch_size: int, forward: float,
                     overhead: float) -> str:
    """Predicted efficiency of every mode and allreduce precision at ``ranks`` GPUs, per link."""
    rows = []
    for mode in modes(classes):
        for fp16 in (False, True):
            first = predict(mode, ranks, links[0], fp16, batch_size, forward, overhead)
            cells = [mode.name, "fp16" if fp16 else "fp32", f"{1000 * first['compute_s']:.1f}",
                     f"{allreduce_bytes(mode.parameters, fp16) / 1e6:.2f}"]
            cells += [f"{predict(mode, ranks, link, fp16, batch_size, forward, overhead)['efficiency']:.3f}"
                      for link in links]
            rows.append(cells)
    return _table(["mode", "allreduce", "compute ms", "MB"] + list(links), rows)


def loader_table(classes: int, batch_size: int, forward: float, overhead: float, image_size: int) -> str:
    """Images/s and bytes/s each GPU's loader must deliver at the step time of one host on NVLink 4
    (the fastest case: the loader's upper need)."""
    row_bytes = image_size * image_size * 3
    rows = []
    for mode in modes(classes, image_size):
        p = predict(mode, 8, "NVLink 4 (H100, NVSwitch)", False, batch_size, forward, overhead)
        per_row = FEATURES * 4 if mode.forward_passes == 0 else row_bytes
        rate = p["images_per_second_per_gpu"]
        rows.append((mode.name, f"{rate:,.0f}", f"{per_row:,}", f"{rate * per_row / 1e6:,.0f}"))
    return _table(["mode", "images/s per GPU", "bytes per row read", "MB/s per GPU (pixels, or features)"], rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--classes", type=int, default=257, help="the head's classes (Caltech-256: 257)")
    parser.add_argument("--batch-size", type=int, default=32, help="images per GPU per step")
    parser.add_argument("--image-size", type=int, default=299)
    parser.add_argument("--forward-images-per-second", type=float, default=FORWARD_IMAGES_PER_SECOND,
                        help="one GPU's backbone forward rate (ASSUMED default: Keras' published 8.1 ms per 32)")
    parser.add_argument("--step-overhead-ms", type=float, default=1.0,
                        help="fixed cost per step: kernel launches, Python, the optimizer (ASSUMED)")
    parser.add_argument("--gpus-per-host", type=int, default=8)
    parser.add_argument("--fit-np", type=int, default=0, help="fit: the run's world size")
    parser.add_argument("--fit-step-ms", type=float, default=0.0, help="fit: measured step time")
    parser.add_argument("--fit-allreduce-ms", type=float, default=0.0,
                        help="fit: allreduce time per step (Horovod timeline's ALLREDUCE share x step)")
    parser.add_argument("--fit-bytes", type=float, default=0.0, help="fit: bytes allreduced per step and rank")
    args = parser.parse_args(argv)
    if min(args.classes, args.batch_size, args.gpus_per_host) < 1 or args.forward_images_per_second <= 0 \
            or args.step_overhead_ms < 0:
        parser.error("--classes, --batch-size, --gpus-per-host and --forward-images-per-second must be "
                     "positive, --step-overhead-ms >= 0")
    try:
        xception_layers(args.image_size)
    except ValueError as exc:
        parser.error(str(exc))
    if args.fit_np:
        try:
            fitted = fit(args.fit_np, args.fit_step_ms / 1000, args.fit_allreduce_ms / 1000, args.fit_bytes)
        except ValueError as exc:
            parser.error(str(exc))
        print(f"fitted: effective allreduce bandwidth {fitted['bandwidth'] / GB:.2f} GB/s, "
              f"compute {1000 * fitted['compute_s']:.1f} ms per step")
        for n in (8, 64, 512):
            comm = ring_allreduce_seconds(args.fit_bytes, n, fitted["bandwidth"])
            print(f"  predicted at {n} ranks on the same links: efficiency "
                  f"{efficiency(fitted['compute_s'], comm):.3f}")
        return 0
    overhead = args.step_overhead_ms / 1000
    print(f"Xception at {args.image_size} px, {args.classes} classes, batch {args.batch_size} per GPU; ASSUMED: "
          f"{args.forward_images_per_second:,.0f} images/s forward per GPU, {args.step_overhead_ms} ms per step.\n")
    print(parameter_table(args.classes, args.image_size) + "\n")
    for ranks in (8, 64, 512):
        links = INTRA_HOST if ranks <= args.gpus_per_host else INTER_HOST
        where = "one host" if ranks <= args.gpus_per_host else f"{ranks // args.gpus_per_host} hosts"
        print(f"{ranks} GPUs ({where}): scaling efficiency, allreduce not overlapped, bandwidth term only")
        print(efficiency_table(args.classes, ranks, links, args.batch_size, args.forward_images_per_second,
                               overhead) + "\n")
    print("the ring's latency term, 2 (N - 1) x latency, at an ASSUMED 5 us per hop: " + ", ".join(
        f"{n} GPUs {1000 * ring_allreduce_seconds(0, n, 1.0, 5e-6):.2f} ms" for n in (8, 64, 512)) + "\n")
    print("what each GPU's loader must deliver at the step time of 8 GPUs on NVLink 4 (the largest need):")
    print(loader_table(args.classes, args.batch_size, args.forward_images_per_second, overhead, args.image_size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
