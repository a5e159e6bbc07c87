"""GPU placement and NCCL's interface, decided where the ranks are launched (issue 26 items 1-2):
pure functions on fake GPU lists, and the launch refusals they make before any rank starts."""
import os
import stat

import pytest

from pipelines.launch.barrier import rank_env, task_choices
from pipelines.launch.gpus import check_local_gpus, nccl_env, parse_visible, rank_gpu_env, task_gpus, visible_gpu_count
from pipelines.launch.rankenv import ASSIGNED_ENV, read_rank_environment
from pipelines.training.devices import choose_device
from tests.support.env import REPO

GPUS = [f"/physical_device:GPU:{i}" for i in range(8)]
UUID = "GPU-8f2d9b1c-0e4a-4c55-9d1b-3f0d2a6b7c11"
MIG = "MIG-5c0f6a2e-1b3d-5e7f-9a1b-2c3d4e5f6a7b"


@pytest.mark.parametrize("addresses, visible, count, owned", [
    (["3"], None, 8, ["3"]),  # a whole host: Spark's address is CUDA's index
    (["3"], None, None, ["3"]),  # nvidia-smi could not say: kept
    (["0"], ["3"], None, ["3"]),  # an isolated executor (CUDA_VISIBLE_DEVICES=3): its GPU 0 is the host's 3
    (["2"], ["4", "5", "6", "7"], 4, ["6"]),  # YARN/Kubernetes: an index into the container's list
    (["1", "0"], ["4", "5"], 2, ["5", "4"]),
    ([UUID], None, 1, [UUID]),  # UUIDs: CUDA takes them as they are
    ([UUID], ["1", UUID], 2, [UUID]),
    ([MIG], None, None, [MIG]),
    ([], None, 8, []),
])
def test_spark_addresses_become_the_ranks_own_gpus(addresses, visible, count, owned):
    assert task_gpus(addresses, visible, count) == owned


@pytest.mark.parametrize("addresses, visible, count, message", [
    (["3"], None, 1, r"Spark assigned GPU address 3 but this executor sees 1 GPU: an isolated executor's discovery "
                     r"script must number its GPUs 0\.\.0"),  # docker --gpus device=3 and the host's numbering
    (["1"], ["3"], None, r"address 1 but this executor sees 1 GPU \(CUDA_VISIBLE_DEVICES=3\)"),
    (["4"], ["0", "1"], 8, r"address 4 but this executor sees 2 GPUs \(CUDA_VISIBLE_DEVICES=0,1\)"),
    ([UUID], ["0"], 1, r"Spark assigned GPU GPU-8f2d.* which is not among this executor's CUDA_VISIBLE_DEVICES=0"),
    (["01"], None, 8, r"address '01': neither an index"),  # CUDA would read 01 as another device
    (["-1"], None, 8, r"address '-1': neither an index"),
    (["gpu0"], None, 8, r"address 'gpu0': neither an index .* fix the worker's GPU discovery script"),
    ([""], None, 8, r"address '': neither an index"),
])
def test_gpu_addresses_an_executor_cannot_use_are_refused(addresses, visible, count, message):
    with pytest.raises(ValueError, match=message):
        task_gpus(addresses, visible, count)


@pytest.mark.parametrize("value, entries", [(None, None), ("", []), ("0,1", ["0", "1"]), (" 2 , 3,", ["2", "3"]),
                                            (UUID, [UUID])])
def test_cuda_visible_devices_is_read_as_a_list(value, entries):
    assert parse_visible(value) == entries


@pytest.mark.parametrize("local_size, count", [(2, 2), (1, 8), (8, 0), (8, None)])
def test_as_many_ranks_as_gpus_or_cpu_ranks_pass(local_size, count):
    check_local_gpus(local_size, count)


@pytest.mark.parametrize("local_size, count", [(3, 2), (8, 1), (16, 8)])
def test_more_local_ranks_than_gpus_are_refused_naming_both_numbers(local_size, count):
    with pytest.raises(ValueError, match=rf"^{local_size} ranks on this host but {count} GPUs?: start at most one "
                                         rf"rank per GPU \(--spark-np -{count}, horovodrun -np {count}\)"):
        check_local_gpus(local_size, count)


def test_a_rank_takes_its_local_ranks_gpu_or_the_one_it_was_given():
    assert choose_device([], 3, 4).kind == "cpu"  # no GPU: CPU ranks, any number
    assert [choose_device(GPUS, r, 8).index for r in (0, 3, 7)] == [0, 3, 7]  # horovodrun: one GPU per local rank
    given = choose_device(GPUS[:1], 5, 8, assigned=["3"])  # a Spark task's process sees its GPU alone
    assert (given.kind, given.index) == ("gpu", 0) and "GPU 3, assigned by Spark" in given.why
    with pytest.raises(ValueError, match=r"^3 ranks on this host but 2 GPUs"):
        choose_device(GPUS[:2], 2, 3)
    with pytest.raises(ValueError, match=r"this rank was given GPU 3 but TensorFlow sees no GPU"):
        choose_device([], 0, 1, assigned=["3"])


def assigned_gpus(environ):
    return read_rank_environment(environ).assigned_gpus


def test_the_assigned_gpus_are_read_from_the_ranks_environment():
    assert assigned_gpus({}) == [] and assigned_gpus({ASSIGNED_ENV: ""}) == []
    assert assigned_gpus({ASSIGNED_ENV: "3"}) == ["3"] and assigned_gpus({ASSIGNED_ENV: f"0,{UUID}"}) == ["0", UUID]
    # what the launcher writes is what the rank reads
    assert assigned_gpus(rank_gpu_env(["6", UUID], ["2", UUID], {})) == ["2", UUID]


def test_a_ranks_gpu_variables_honour_the_users_order():
    assert rank_gpu_env(["6"], ["2"], {}) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "6",
                                               ASSIGNED_ENV: "2"}
    assert rank_gpu_env([], [], {}) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # GPUs unscheduled: untouched
    assert rank_gpu_env(["6"], ["2"], {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}) == {"CUDA_VISIBLE_DEVICES": "6",
                                                                                  ASSIGNED_ENV: "2"}


def test_nccl_takes_glos_interface_unless_the_user_named_one():
    assert nccl_env("eth1", {}) == {"NCCL_SOCKET_IFNAME": "eth1"}
    assert nccl_env("eth1", {"NCCL_SOCKET_IFNAME": "ib0"}) == {}  # the user's own, kept
    assert nccl_env(None, {}) == {} and nccl_env("", {}) == {}  # Horovod's choice: NCCL's own too


SLOT = {"rank": 5, "local_rank": 1, "local_size": 2, "cross_rank": 2, "cross_size": 3}


def test_a_barrier_tasks_rank_gets_one_interface_for_gloo_and_nccl_and_exactly_its_gpu():
    choices = {"iface": "eth1", "gpus": ["6"], "addresses": ["2"]}
    env = rank_env(SLOT, "10.0.0.7", 6, "10.0.0.5:4000", choices, {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, "T0K")
    assert env["HOROVOD_GLOO_IFACE"] == env["NCCL_SOCKET_IFNAME"] == "eth1"
    assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"], env[ASSIGNED_ENV]) == ("6", "PCI_BUS_ID", "2")
    assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_LOCAL_RANK"], env["HOROVOD_LOCAL_SIZE"]) == \
        ("5", "6", "1", "2")
    assert (env["HOROVOD_GLOO_RENDEZVOUS_ADDR"], env["HOROVOD_GLOO_RENDEZVOUS_PORT"]) == ("10.0.0.5:4000/T0K", "4000")
    users = rank_env(SLOT, "h", 6, "h0:1", dict(choices, gpus=[], addresses=[]), {"NCCL_SOCKET_IFNAME": "ib0"}, "T")
    assert "NCCL_SOCKET_IFNAME" not in users and "CUDA_VISIBLE_DEVICES" not in users and ASSIGNED_ENV not in users


def test_a_task_that_cannot_use_its_gpu_stops_every_task_before_any_rank():
    ok = task_choices("127.0.0.1", "lo", ["0"], 1, {"CUDA_VISIBLE_DEVICES": "3"})
    assert ok == {"iface": "lo", "gpus": ["3"], "addresses": ["0"]}
    isolated = task_choices("127.0.0.1", "lo", ["3"], 1, {"CUDA_VISIBLE_DEVICES": "0"})
    assert isolated == {"error": "Refused: Spark assigned GPU address 3 but this executor sees 1 GPU "
                                 "(CUDA_VISIBLE_DEVICES=0): an isolated executor's discovery script must number its "
                                 "GPUs 0..0 as the executor sees them", "refused": True}
    crowded = task_choices("127.0.0.1", "lo", [], 3, {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert crowded["error"].startswith("Refused: 3 ranks on this host but 2 GPUs") and crowded["refused"]
    ipv6 = task_choices("::1", "lo", [], 1, {})
    assert ipv6["error"].startswith("Refused: host ::1 has no IPv4 address") and ipv6["refused"]


def _fake_nvidia_smi(folder, gpus):
    script = folder / "nvidia-smi"
    lines = "".join(f"echo 'GPU {i}: NVIDIA H100 (UUID: GPU-{i})'\n" for i in range(gpus))
    script.write_text("#!/bin/sh\n" + lines)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_the_visible_gpus_are_counted_from_cuda_visible_devices_else_nvidia_smi(tmp_path, monkeypatch):
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": ""}) == 0
    monkeypatch.setenv("PATH", str(tmp_path))
    assert visible_gpu_count({}) == 0  # no nvidia-smi: no NVIDIA driver
    _fake_nvidia_smi(tmp_path, 3)
    assert visible_gpu_count({}) == 3
    (tmp_path / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    assert visible_gpu_count({}) is None  # it failed: unknown, so nothing is refused on its word


def test_more_local_ranks_than_gpus_are_refused_before_any_rank_starts(monkeypatch):
    from pipelines.launch import HorovodRunner
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    started = []
    runner = HorovodRunner(np=-3, before_ranks=lambda: started.append(1))
    with pytest.raises(ValueError, match=r"^3 ranks on this host but 2 GPUs"):
        runner.run(os.getpid)
    assert started == []  # refused before the last step before the ranks (training's weights fetch)


@pytest.mark.slow
def test_train_refuses_more_local_ranks_than_gpus_with_exit_2(tmp_path):
    from tests.support.training import refused_launch

    proc, errors = refused_launch(tmp_path, -3, 3, CUDA_VISIBLE_DEVICES="0,1")  # enough row groups for 3 ranks
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(errors) == 1 and "3 ranks on this host but 2 GPUs" in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "rank 0" not in proc.stderr


def _fake_smi_indices(folder, indices):
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + "".join(f"echo {i}\n" for i in indices))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize("visible, smi, addresses", [
    (None, [0, 1, 2], ["0", "1", "2"]),  # a whole host: nvidia-smi's indices
    ("4,5", [0, 1, 2, 3, 4, 5, 6, 7], ["0", "1"]),  # limited by CUDA_VISIBLE_DEVICES: indices into it
    ("", [0, 1], []),  # none visible
    (None, None, []),  # no nvidia-smi: no GPU
])
def test_the_discovery_script_offers_addresses_the_launcher_maps_back(tmp_path, visible, smi, addresses):
    import json
    import subprocess
    repo = REPO
    if smi is not None:
        _fake_smi_indices(tmp_path, smi)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", **({} if visible is None else {"CUDA_VISIBLE_DEVICES": visible})}
    out = subprocess.run(["bash", os.path.join(repo, "scripts", "gpu_discovery.sh")], capture_output=True, text=True,
                         env=env, check=True).stdout
    assert json.loads(out) == {"name": "gpu", "addresses": addresses}
    visible_list = parse_visible(visible)
    assert len(task_gpus(addresses, visible_list, len(smi or []))) == len(addresses)  # every address maps
