"""The loader benchmark's peers (benchmarks/loader_peers.py) and its ``--readers`` flag: the names it
takes, a peer that is not installed, each peer's rows against our sharding rule, the goal lines,
and that the product never imports a peer. Fast but for Ray's own route (slow: Ray starts its
workers), which runs where the peers are installed (``make bench-peers``)."""
import ast
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import loader_bench, loader_peers
from pipelines.runtime.errors import Refused
from tests.support import datagen
from tests.support.env import REPO as ROOT, subprocess_env


@pytest.mark.parametrize("flag, unknown", [("nope", "nope"), ("own,Ray", "Ray"), ("own,petastorm,plain,tf", "tf"),
                                           (",", "empty list")])
def test_an_unknown_reader_exits_2_with_one_line_listing_the_names(flag, unknown):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "loader_bench.py"), "--readers", flag],
                            capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"loader_bench.py: --readers {flag}: unknown {unknown}; choose from own, petastorm, ray, plain"]


@pytest.mark.current  # which readers run here is the stack's
def test_a_peer_not_installed_is_one_line_naming_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(loader_peers.NEEDS, "ray", ("no_such_module_here", "make bench-peers STACK={stack}"))
    assert loader_bench.pick_readers("own,ray,plain", False) == ["own", "plain"]
    assert capsys.readouterr().out.splitlines() == [
        f"ray: skipped, no_such_module_here is not installed here: make bench-peers STACK={loader_bench_stack()} "
        "installs it"]
    # the default is every reader that runs here, ours first (gpu_check reads the first one's figures)
    from pipelines.training.data import petastorm_available

    runs = petastorm_available()  # the mission stack's
    assert loader_bench.pick_readers("", runs) == ["own"] + ["petastorm"] * runs + ["plain"]
    assert loader_bench.pick_readers("", False) == ["own", "plain"]
    capsys.readouterr()
    with pytest.raises(Refused, match=r"--readers ray: none of them is installed here"):
        loader_bench.pick_readers("ray", True)
    monkeypatch.setitem(loader_peers.NEEDS, "ray", ("numpy", "x"))  # installed: no line
    assert loader_peers.missing("ray", "mission") is None and loader_peers.missing("plain", "mission") is None
    assert loader_bench.pick_readers("ray,ray,own", False) == ["ray", "own"]


def loader_bench_stack():
    from pipelines.stack import active

    return active().name


def labels_of(batches):
    return [int(x) for _, labels in batches for x in labels]


@pytest.mark.current  # the stack's pyarrow
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_the_plain_routes_shards_are_our_readers_row_groups(tmp_path, world_size):
    """Rank r's rows are row groups r, r + n, ... of the split (files in order, groups in file
    order), as OnePassShard and both readers take them; the images are the stored bytes."""
    from pipelines.training.data import OnePassShard, load_dataset

    datagen.write_dataset(str(tmp_path), [3, 1, 4], [1], size=4, rows_per_group=2)
    data = load_dataset(str(tmp_path), world_size)
    seen = []
    for rank in range(world_size):
        batches = list(loader_peers.plain_batches(data, "train", rank, world_size))
        assert labels_of(batches) == labels_of(OnePassShard(data, "train", rank, world_size).batches())
        for images, labels in batches:
            assert images.dtype == np.uint8 and images.shape == (len(labels), 4, 4, 3)
            assert (images == (labels % 256).astype(np.uint8)[:, None, None, None]).all()
        seen += labels_of(batches)
    assert sorted(seen) == list(range(16))


@pytest.mark.current  # the stack's pyarrow and TensorFlow
def test_the_plain_route_gives_full_uint8_batches_of_every_row_each_epoch(tmp_path):
    pytest.importorskip("tensorflow")
    from pipelines.training.config import TrainConfig
    from pipelines.training.data import load_dataset

    datagen.write_dataset(str(tmp_path), [3, 1, 4], [1], size=4, rows_per_group=2)
    data = load_dataset(str(tmp_path), 1)
    ds = loader_peers.plain_dataset(data, TrainConfig(data=str(tmp_path), output=str(tmp_path), batch_size=4,
                                                      shuffle_buffer=8))
    for _ in range(2):  # each iteration one epoch, as Keras takes a finite dataset
        got = [(images.numpy(), labels.numpy()) for images, labels in ds]
        assert [images.shape for images, _ in got] == [(4, 4, 4, 3)] * 4 and got[0][0].dtype == np.uint8
        assert sorted(labels_of(got)) == list(range(16))


def test_each_goal_line_holds_ours_against_every_reader_that_ran():
    """Petastorm's same path; a peer's best route of the same epoch (Ray: cached or streaming)."""
    found = {"own, cold cache (epoch 1)": 900.0, "own, warm cache (epoch 2)": 1200.0,
             "petastorm, cold cache (epoch 1)": 450.0, "petastorm, warm cache (epoch 2)": 1000.0,
             "ray, cold cache (epoch 1)": 300.0, "ray, warm cache (epoch 2)": 1500.0,
             "ray, no cache (epoch 1)": 400.0, "ray, no cache (epoch 2)": 420.0,
             "plain, no cache (epoch 1)": 600.0, "plain, no cache (epoch 2)": 800.0}
    assert loader_bench.goal_lines(found, 1500.0) == [
        "goal, ours, cold cache (epoch 1): 0.600 of the ceiling (goal >= 0.6: met); 2.000x Petastorm's (goal >= 1: "
        "met); 2.250x Ray Data's (goal >= 1: met); 1.500x the plain route's (goal >= 1: met)",
        "goal, ours, warm cache (epoch 2): 0.800 of the ceiling (goal >= 0.9: NOT met); 1.200x Petastorm's (goal >= "
        "1: met); 0.800x Ray Data's (goal >= 1: NOT met); 1.500x the plain route's (goal >= 1: met)"]
    streaming_only = {k: v for k, v in found.items() if "ray, cold" not in k and "ray, warm" not in k}
    assert loader_bench.rival(streaming_only, "ray", "warm cache (epoch 2)") == 420.0
    assert loader_bench.rival(found, "plain", "cold cache (epoch 1)") == 600.0
    assert loader_bench.rival({}, "ray", "cold cache (epoch 1)") is None
    assert loader_bench.labels(["own", "plain"]) == [
        "own, cold cache (epoch 1)", "own, warm cache (epoch 2)", "own, no cache (epoch 2)",
        "plain, no cache (epoch 1)", "plain, no cache (epoch 2)"]


PEER_MODULES = {"ray", "benchmarks", "loader_peers"}


def peer_imports(source: str) -> set:
    """The top-level names of the modules ``source`` imports that are the benchmarks' peers (or the
    benchmarks themselves)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        found |= {name.split(".")[0] for name in names} & PEER_MODULES
    return found


def test_the_product_never_imports_a_peer():
    """pipelines/ and jobs/ import neither Ray nor the benchmarks (the peers are installed for the
    benchmarks only, by make bench-peers)."""
    assert peer_imports("import ray.data\nfrom benchmarks import loader_peers\nimport numpy") == {"ray", "benchmarks"}
    assert peer_imports("def f():\n    from ray import data\n") == {"ray"}  # a lazy import counts too
    offenders = {}
    for top in ("pipelines", "jobs"):
        for folder, _, names in os.walk(os.path.join(ROOT, top)):
            for name in (n for n in names if n.endswith(".py")):
                path = os.path.join(folder, name)
                found = peer_imports(open(path, encoding="utf-8").read())
                if found:
                    offenders[os.path.relpath(path, ROOT)] = found
    assert offenders == {}


@pytest.mark.slow
def test_ray_datas_routes_give_every_row_of_the_shard_as_uint8_batches(tmp_path):
    """Both of Ray's routes (materialised in its object store, streaming), two epochs each: full
    batches, the stored bytes, every row once (rows a multiple of the batch)."""
    pytest.importorskip("ray", reason="the peers are not installed: make bench-peers")
    from pipelines.training.config import TrainConfig
    from pipelines.training.data import load_dataset

    datagen.write_dataset(str(tmp_path), [3, 1, 4], [1], size=4, rows_per_group=2)
    data = load_dataset(str(tmp_path), 1)
    config = TrainConfig(data=str(tmp_path), output=str(tmp_path), batch_size=4, shuffle_buffer=8)
    loader_peers.start_ray()
    try:
        for cached in (True, False):
            ds = loader_peers.ray_dataset(data, config, cached)
            for _ in range(2):
                got = [(images.numpy(), labels.numpy()) for images, labels in ds]
                assert [images.shape for images, _ in got] == [(4, 4, 4, 3)] * 4 and got[0][0].dtype == np.uint8
                assert sorted(labels_of(got)) == list(range(16))
                for images, labels in got:
                    assert (images == (labels % 256).astype(np.uint8)[:, None, None, None]).all()
        results = {}
        loader_peers.time_peer("ray", data, config, results, 4)
        assert sorted(results) == sorted(f"ray, {kind}" for kind in loader_peers.kinds("ray"))
        assert all(rate > 0 for rate in results.values())
    finally:
        loader_peers.stop_ray()


@pytest.mark.parametrize("name", ["mission", "current"])
def test_each_peers_lock_is_its_in_files_pins_held_to_the_stacks_lock_each_with_a_hash(name):
    """make bench-peers installs requirements/<stack>-peers.lock --no-deps into the stack's venv: each
    version the stack locks too is the stack's own (so nothing of the stack moves), ray is the .in's."""
    from tests.support.locks import lock_pins

    peers, own = lock_pins(f"{name}-peers"), lock_pins(name)
    assert {package: own[package] for package in peers if package in own} == \
        {package: version for package, version in peers.items() if package in own}
    with open(os.path.join(ROOT, "requirements", f"{name}-peers.in")) as f:
        text = f.read()
    assert f"-c {name}.lock" in text.splitlines() and f"ray[data]=={peers['ray']}" in text.splitlines()
    assert set(peers) - set(own) == {"ray", "msgpack", "filelock"}  # what the venv gains
    with open(os.path.join(ROOT, "requirements", f"{name}-peers.lock")) as f:
        assert f.read().count("--hash=sha256:") >= len(peers)
