"""scripts/gpu_check.py: its parsing and checks (pure; the whole check as a dry run on the CPU:
tests/e2e/test_gpu_check.py)."""

import pytest

from scripts import gpu_check as gc

CHECK_BUILD = """Horovod v0.28.1:

Available Frameworks:
    [X] TensorFlow
    [ ] PyTorch
    [ ] MXNet

Available Controllers:
    [ ] MPI
    [X] Gloo

Available Tensor Operations:
    [{nccl}] NCCL
    [ ] DDL
    [ ] CCL
    [ ] MPI
    [X] Gloo
"""


def test_check_build_is_read_by_section():
    sections = gc.parse_check_build(CHECK_BUILD.format(nccl="X"))
    assert sections["Available Frameworks"] == {"TensorFlow": True, "PyTorch": False, "MXNet": False}
    assert sections["Available Tensor Operations"]["NCCL"] is True
    assert sections["Available Controllers"]["MPI"] is False  # MPI is both a controller and an operation
    assert gc.build_problems(sections, need_nccl=True) == []


def test_a_build_without_nccl_fails_on_a_gpu_host_only():
    sections = gc.parse_check_build(CHECK_BUILD.format(nccl=" "))
    assert gc.build_problems(sections, need_nccl=True) == [
        "horovodrun --check-build does not list NCCL under Available Tensor Operations"]
    assert gc.build_problems(sections, need_nccl=False) == []
    assert len(gc.build_problems({}, need_nccl=True)) == 3  # no output at all: all three missing


def test_nvidia_smi_lines():
    text = "0, NVIDIA H100 80GB HBM3, 00000000:18:00.0\n1, NVIDIA H100 80GB HBM3, 00000000:2A:00.0\n"
    assert gc.parse_gpus(text) == [
        {"index": "0", "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:18:00.0"},
        {"index": "1", "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:2A:00.0"}]
    assert gc.parse_gpus("") == []


@pytest.mark.parametrize("text,gpus,dry,expected", [
    ("1,2,4,8", 8, False, [1, 2, 4, 8]), ("8,1,2", 8, False, [1, 2, 8]), ("1,2", 0, True, [1, 2])])
def test_world_sizes(text, gpus, dry, expected):
    assert gc.world_sizes(text, gpus, dry) == expected


@pytest.mark.parametrize("text,gpus,message", [
    ("1,2,4,8", 4, "--np 8 needs 8 GPUs (one per rank); this host has 4"),
    ("1,2", 0, "--np 2 needs 2 GPUs (one per rank); this host has 0"),
    ("0,1", 8, "positive integers"), ("one", 8, "comma-separated integers"), ("", 8, "positive integers")])
def test_world_sizes_refused(text, gpus, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        gc.world_sizes(text, gpus, dry_run=False)


def _rank(rank, host="h1", bus=None):
    return {"rank": rank, "local_rank": rank, "host": host, "gpus": [] if bus is None else [{"name": "/gpu:0",
                                                                                              "pci_bus_id": bus}]}


def test_probe_problems_name_each_fault():
    good = {"ranks": [_rank(0, bus="0000:18:00.0"), _rank(1, bus="0000:2a:00.0")], "sum": 1.0}
    assert gc.probe_problems(good, 2, dry_run=False) == []
    shared = {"ranks": [_rank(0, bus="0000:18:00.0"), _rank(1, bus="0000:18:00.0")], "sum": 1.0}
    assert gc.probe_problems(shared, 2, dry_run=False) == ["ranks 0 and 1 on h1 share GPU 0000:18:00.0"]
    other_hosts = {"ranks": [_rank(0, "h1", "0000:18:00.0"), _rank(1, "h2", "0000:18:00.0")], "sum": 1.0}
    assert gc.probe_problems(other_hosts, 2, dry_run=False) == []
    none = {"ranks": [_rank(0), _rank(1)], "sum": 1.0}
    assert gc.probe_problems(none, 2, dry_run=False) == ["rank 0 on h1 sees 0 GPUs, expected 1",
                                                          "rank 1 on h1 sees 0 GPUs, expected 1"]
    assert gc.probe_problems(none, 2, dry_run=True) == []
    assert gc.probe_problems({**none, "sum": 0.0}, 2, dry_run=True) == [
        "allreduce of the ranks' numbers gave 0.0, expected 1"]
    assert gc.probe_problems(None, 4, dry_run=True) == ["the 4-rank probe printed no report"]


LOADER = """
Loader benchmark: Fashion-MNIST at 71 px, batch 4, 2 reader threads, 2 CPUs, median of 1; ceiling (in memory, same tail) 5123 images/s, the mean of 5000 and 5246 (before and after the sweep)

1 MiB row groups: 3 rows each, 12 in train
  own, cold cache (epoch 1)                     811 images/s  0.16x ceiling  own / petastorm 1.11
  own, warm cache (epoch 2)                    2400 images/s  0.47x ceiling  own / petastorm 0.90
  own, no cache (epoch 2)                       900 images/s  0.18x ceiling  own / petastorm 4.00
  petastorm, cold cache (epoch 1)               730 images/s  0.14x ceiling
  petastorm, warm cache (epoch 2)              2660 images/s  0.52x ceiling
goal, ours, cold cache (epoch 1): 0.158 of the ceiling (goal >= 0.6: NOT met); 1.111x Petastorm's (goal >= 1: met)
goal, ours, warm cache (epoch 2): 0.468 of the ceiling (goal >= 0.9: NOT met); 0.902x Petastorm's (goal >= 1: NOT met)

4 MiB row groups: 12 rows each, 3 in train
  own, cold cache (epoch 1)                     999 images/s  0.20x ceiling
"""


def test_loader_output_is_read_by_label():
    """The first row-group size's table, the first reader's figure for each path, and the ceiling."""
    labels = ("cold cache (epoch 1)", "warm cache (epoch 2)", "no cache (epoch 2)")
    assert gc.parse_loader(LOADER, labels) == {"ceiling": 5123.0, "cold cache (epoch 1)": 811.0,
                                               "warm cache (epoch 2)": 2400.0, "no cache (epoch 2)": 900.0}
    assert gc.parse_loader("Traceback ...", labels) == {}


def test_the_loader_benchmark_checks_our_reader_against_each_goal():
    """The goal lines of LOADER's first table, from its figures; ours alone: the ceiling only."""
    from benchmarks.loader_bench import goal_lines

    found = {"own, cold cache (epoch 1)": 811.0, "own, warm cache (epoch 2)": 2400.0, "own, no cache (epoch 2)": 900.0,
             "petastorm, cold cache (epoch 1)": 730.0, "petastorm, warm cache (epoch 2)": 2660.0}
    assert goal_lines(found, 5123.0) == [line for line in LOADER.splitlines() if line.startswith("goal, ")]
    assert goal_lines({"own, cold cache (epoch 1)": 3100.0, "own, warm cache (epoch 2)": 4500.0}, 5000.0) == [
        "goal, ours, cold cache (epoch 1): 0.620 of the ceiling (goal >= 0.6: met)",
        "goal, ours, warm cache (epoch 2): 0.900 of the ceiling (goal >= 0.9: met)"]
    # just short: three decimals, so that a figure that misses never reads as the goal itself
    assert goal_lines({"own, warm cache (epoch 2)": 4497.0}, 5000.0) == [
        "goal, ours, warm cache (epoch 2): 0.899 of the ceiling (goal >= 0.9: NOT met)"]
    assert goal_lines({"petastorm, cold cache (epoch 1)": 730.0}, 5123.0) == []


@pytest.mark.current  # the stack's TensorFlow
def test_the_loader_benchmarks_float32_tail_preprocesses_each_batch_as_xception_does():
    """``--tail float32``: each batch cast and scaled on the host to [-1, 1]; the default adds nothing."""
    tf = pytest.importorskip("tensorflow")
    from benchmarks.loader_bench import host_float32

    ds = tf.data.Dataset.from_tensor_slices((tf.constant([[0, 127], [255, 51]], tf.uint8), [1, 2])).batch(2)
    (images, labels), = list(host_float32(ds, True))
    assert images.dtype == tf.float32 and labels.numpy().tolist() == [1, 2]
    assert images.numpy().ravel().tolist() == pytest.approx([-1.0, 127 / 127.5 - 1, 1.0, 51 / 127.5 - 1], abs=1e-6)
    assert host_float32(ds, False) is ds


def _row(run, n, fp16, share, step_ms, nbytes, rate, eff):
    return {"run": run, "mixed_precision": "False", "world_size": str(n), "fp16_allreduce": str(fp16),
            "allreduce_share": str(share), "negotiation_share": "0.01", "step_ms": str(step_ms),
            "allreduce_bytes_per_step": str(nbytes), "images_per_second": str(rate), "scaling_efficiency": eff}


def test_fitted_bandwidth_and_table_by_hand():
    rows = [_row("frozen", 1, False, 0.0, 100.0, 4000, 320.0, "1.0"),
            _row("frozen", 2, False, 0.25, 100.0, 4000, 600.0, "0.9375")]
    # 2 ranks: 2 * 1/2 * 4000 B in 0.25 * 0.1 s = 160,000 B/s
    assert gc.fitted_bandwidths(rows) == {"frozen, fp32 allreduce": pytest.approx(160_000.0)}
    table = gc.format_table(rows, {"warm": 1234.0})
    lines = table.splitlines()
    assert lines[3].split() == ["frozen", "off", "2", "float32", "0.004", "100.0", "600.0", "300.0", "0.938",
                                "25.00%", "1.00%"]
    assert lines[-1] == "loader, one process: warm                                  1234 images/s"


def test_rates_keep_a_readable_unit():
    assert [gc.rate(x) for x in (2.5e10, 3.0e8, 1234.0)] == ["25.00 GB/s", "300.00 MB/s", "1.23 kB/s"]


def test_bad_input_exits_2_before_anything_runs(tmp_path):
    for argv in (["--dry-run", "--np", "0,1"], ["--dry-run", "--data", str(tmp_path)]):
        with pytest.raises(SystemExit) as exc:
            gc.parse_args(argv + ["--out", str(tmp_path / "out")])
        assert exc.value.code == 2
    assert not (tmp_path / "out").exists()
