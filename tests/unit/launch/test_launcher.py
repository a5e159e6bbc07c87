"""HorovodRunner's pure parts: rank plans, interfaces and addresses, failures and their causes,
Spark's settings (its local mode and Spark barrier tasks, run for real:
tests/ranks/test_launcher.py)."""
import socket

import pytest

from pipelines.launch import HorovodJobFailed, HorovodRunner, RankFailure
from pipelines.launch.barrier import rank_plan
from pipelines.launch.local import collect_failures
from tests.support.rank_work import rank_sum

pytestmark = pytest.mark.current  # on the current stack too (make test's current share)


@pytest.mark.parametrize("np", [0, 1.5, "2"])
def test_bad_np_is_refused(np):
    with pytest.raises(ValueError, match="np must be a non-zero integer"):
        HorovodRunner(np=np)


def test_rank_plan_numbers_ranks_host_by_host():
    plan = rank_plan(["b", "a", "b", "a", "c"])
    assert [p["rank"] for p in plan] == [0, 2, 1, 3, 4]
    assert [p["local_rank"] for p in plan] == [0, 0, 1, 1, 0]
    assert [p["local_size"] for p in plan] == [2, 2, 2, 2, 1]
    assert [p["cross_rank"] for p in plan] == [0, 1, 0, 1, 2] and plan[0]["cross_size"] == 3


def test_failure_message_puts_the_root_cause_first():
    exc = HorovodJobFailed([RankFailure(0, "HorovodInternalError: peer gone", secondary=True),
                            RankFailure(1, "RuntimeError: boom")])
    assert str(exc).startswith("rank 1 failed: RuntimeError: boom")


def test_a_local_rank_that_ended_without_a_record_is_named_with_its_exit_status():
    """A rank killed by a signal (-9: SIGKILL, as subprocess reports it) is a lost process, which a
    relaunch may survive (--max-failures); a crash (SIGSEGV) or a status of its own is not; the ranks
    the driver stopped after a failure (not in ``ended``) are not failures of their own."""
    here = socket.gethostname()
    killed = collect_failures({0: None, 1: None}, {1: -9}, here)
    assert str(HorovodJobFailed(killed)) == f"rank 1 on {here} failed: process killed by signal SIGKILL"
    assert killed[0].lost and len(killed) == 1
    other = collect_failures({0: None, 1: None}, {1: 3}, here)
    assert str(HorovodJobFailed(other)) == f"rank 1 on {here} failed: process exited with status 3"
    assert not other[0].lost
    assert not collect_failures({1: None}, {1: -11}, here)[0].lost  # SIGSEGV: a crash
    silent = collect_failures({0: None}, {0: 0}, here)
    assert [(f.rank, f.cause) for f in silent] == [(0, "process ended without writing its result")]
    assert collect_failures({0: {"status": "ok", "result": ""}, 1: {"status": "ok", "result": ""}}, {0: 0, 1: 0},
                            here) == []


def test_a_peer_error_never_hides_the_root_cause():
    """The innocent rank may end first, of its peer's failure; the ranks' own error texts decide."""
    records = {0: {"status": "error", "rank": 0, "cause": "UnknownError: Horovod has been shut down",
                   "traceback": "", "secondary": True},
               1: {"status": "error", "rank": 1, "cause": "ValueError: broken", "traceback": "", "secondary": False}}
    assert str(HorovodJobFailed(collect_failures(records, {0: 1}, "h"))).startswith("rank 1 on h failed: ValueError")


# -- which network interface Gloo uses (issue 9, item 4) ----------------------------------------
from pipelines.launch import ClusterConfigError  # noqa: E402
from pipelines.launch.network import interface_of, is_this_machine, local_interfaces, resolve  # noqa: E402
from pipelines.launch.sparkcheck import check_barrier_conf  # noqa: E402
from pipelines.runtime.spark import is_local_master  # noqa: E402

IFACES = {"lo": ["127.0.0.1", "::1"], "eth0": ["192.0.2.2", "fe80::1"], "ib0": ["10.1.0.5"]}


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.1.1", "127.0.0.2", "127.255.255.254", "::1", "localhost"])
def test_every_loopback_address_maps_to_lo(host):
    """Linux routes all of 127.0.0.0/8 over lo although only 127.0.0.1 is configured on it."""
    assert interface_of(host, interfaces=IFACES) == "lo"
    assert interface_of(host, interfaces={"lo": ["127.0.0.1"], "eth0": ["192.0.2.2"]}) == "lo"  # no IPv6 on lo


@pytest.mark.parametrize("host, iface", [("192.0.2.2", "eth0"), ("10.1.0.5", "ib0"), ("fe80::1", "eth0")])
def test_other_addresses_map_to_the_interface_that_carries_them(host, iface):
    assert interface_of(host, interfaces=IFACES) == iface


@pytest.mark.parametrize("host", ["10.1.0.6", "192.0.2.3", "203.0.113.7"])
def test_an_address_on_no_interface_is_a_clear_error(host):
    with pytest.raises(ValueError) as info:
        interface_of(host, interfaces=IFACES)
    message = str(info.value)
    assert f"no network interface of host {host} has its address {host}" in message
    assert "eth0 (192.0.2.2 fe80::1), ib0 (10.1.0.5), lo (127.0.0.1 ::1)" in message
    assert "--network-interface" in message and "\n" not in message


@pytest.mark.parametrize("host", ["127.0.1.1", "192.0.2.2", "10.9.9.9"])
def test_a_requested_interface_is_used_as_given_never_replaced(host):
    assert interface_of(host, "eth0", IFACES) == "eth0"
    assert interface_of(host, "ib0", IFACES) == "ib0"


@pytest.mark.parametrize("requested", ["nosuch0", "eth1", "LO"])
def test_a_requested_interface_that_does_not_exist_is_refused_by_name(requested):
    with pytest.raises(ValueError) as info:
        interface_of("127.0.0.1", requested, IFACES)
    assert str(info.value) == (f"network interface {requested!r} (HOROVOD_GLOO_IFACE / --network-interface) does "
                               f"not exist on host 127.0.0.1; its interfaces: eth0 (192.0.2.2 fe80::1), "
                               f"ib0 (10.1.0.5), lo (127.0.0.1 ::1)")


def test_hostnames_resolve_on_this_machine():
    import ipaddress
    import socket
    ifaces = local_interfaces()
    assert ipaddress.ip_address(resolve("localhost")).is_loopback and interface_of("localhost") == "lo"
    name, address = socket.gethostname(), resolve(socket.gethostname())  # Debian/Ubuntu: 127.0.1.1
    expected = "lo" if ipaddress.ip_address(address).is_loopback else next(
        n for n, addresses in ifaces.items() if address in addresses)
    assert interface_of(name) == expected
    assert is_this_machine(name) and is_this_machine("127.0.1.1") and is_this_machine("localhost")
    assert not is_this_machine("203.0.113.7") and not is_this_machine("no-such-host.invalid")
    with pytest.raises(ValueError, match="host 'no-such-host.invalid' does not resolve"):
        interface_of("no-such-host.invalid")


def test_local_mode_refuses_a_missing_interface_before_any_rank(monkeypatch):
    monkeypatch.setenv("HOROVOD_GLOO_IFACE", "nosuch0")
    with pytest.raises(ValueError, match=r"network interface 'nosuch0' .* does not exist on host localhost; "
                                         r"its interfaces: .*lo \(127\.0\.0\.1"):
        HorovodRunner(np=-2).run(rank_sum, offset=0)
    assert HorovodRunner(np=2, network_interface="eth7").network_interface == "eth7"  # the argument wins


@pytest.mark.parametrize("requested, refused", [("lo", False), ("eth0", True), ("ib0", True)])
def test_local_ranks_take_only_the_loopback_interface_horovod_accepts(requested, refused):
    from pipelines.launch.network import local_interface
    if refused:
        with pytest.raises(ValueError, match=rf"network interface '{requested}' \(.+\) cannot carry local ranks"):
            local_interface(requested, IFACES)
    else:
        assert local_interface(requested, IFACES) == "lo"
    assert local_interface(None, IFACES) is None and local_interface("", IFACES) is None  # Horovod's own choice


@pytest.mark.parametrize("master, value", [("spark://10.0.0.1:7077", "true"), ("local-cluster[2,1,1024]", "TRUE"),
                                           ("yarn", " True "), ("k8s://https://10.0.0.1:6443", "true")])
def test_dynamic_allocation_is_refused_by_name(master, value):
    conf = {"spark.master": master, "spark.dynamicAllocation.enabled": value}
    with pytest.raises(ClusterConfigError) as info:
        check_barrier_conf(conf)
    message = str(info.value)
    assert message.startswith(f"spark.dynamicAllocation.enabled={value.strip()}: Spark runs no barrier tasks")
    assert "set spark.dynamicAllocation.enabled=false" in message and master in message and "\n" not in message
    assert isinstance(info.value, ValueError)  # jobs/train.py: exit 2


@pytest.mark.parametrize("conf", [
    {"spark.master": "spark://h:7077"},
    {"spark.master": "spark://h:7077", "spark.dynamicAllocation.enabled": "false"},
    {"spark.master": "local[2]", "spark.dynamicAllocation.enabled": "true"},  # Spark ignores it on local masters
    {"spark.master": "local", "spark.dynamicAllocation.enabled": "true"},
    {"spark.master": "spark://h:7077", "spark.speculation": "true"},  # Spark never speculates barrier tasks
])
def test_settings_barrier_tasks_run_under_pass(conf):
    check_barrier_conf(conf)


def test_dynamic_allocation_testing_counts_on_local_masters_too():
    with pytest.raises(ClusterConfigError, match="spark.dynamicAllocation.enabled=true"):
        check_barrier_conf({"spark.master": "local[2]", "spark.dynamicAllocation.enabled": "true",
                            "spark.dynamicAllocation.testing": "true"})


@pytest.mark.parametrize("master, local", [("local", True), ("local[2]", True), ("local[*]", True),
                                           ("local[2,3]", True), ("local-cluster[2,1,1024]", False),
                                           ("spark://127.0.0.1:7077", False), ("yarn", False)])
def test_local_masters_are_spark_s(master, local):
    assert is_local_master(master) is local


def test_import_pipelines_is_light_and_exports_the_runner():
    import subprocess
    import sys
    code = ("import sys, pipelines\n"
            "heavy = ('tensorflow', 'horovod', 'pyspark')\n"
            "print(sorted(m for m in heavy if m in sys.modules))\n"
            "from pipelines import HorovodRunner, HorovodJobFailed, ClusterConfigError\n"
            "import pipelines.launch as l\n"
            "print(HorovodRunner is l.HorovodRunner, HorovodJobFailed is l.HorovodJobFailed,"
            " ClusterConfigError is l.ClusterConfigError, 'HorovodRunner' in dir(pipelines))\n"
            "print(sorted(m for m in heavy if m in sys.modules))\n"
            "from pipelines import contract\n"  # submodules still import as before
            "try:\n    pipelines.NoSuchThing\nexcept AttributeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[]", "True True True True", "[]",
                                "module 'pipelines' has no attribute 'NoSuchThing'"]


@pytest.mark.parametrize("spark_np, accepted", [(0, False), (2, True), (-2, True)])
def test_network_interface_flag_applies_to_spark_np_runs_only(spark_np, accepted, capsys):
    """Under horovodrun (--spark-np 0) the flag would be silently ignored: refused instead."""
    from pipelines.runtime.config import parse_configs
    from pipelines.launch.config import LaunchConfig
    from pipelines.training.config import TrainConfig
    argv = ["--data", "d", "--output", "o", "--spark-np", str(spark_np), "--network-interface", "eth0"]
    if accepted:
        train, launch = parse_configs((TrainConfig, LaunchConfig), argv)
        assert (launch.np, launch.network_interface, launch.world_size) == (spark_np, "eth0", 2)
        assert not hasattr(train, "network_interface")  # a rank's config holds no launch setting
    else:
        with pytest.raises(SystemExit) as info:
            parse_configs((TrainConfig, LaunchConfig), argv)
        assert info.value.code == 2
        assert "--network-interface applies to --spark-np runs" in capsys.readouterr().err
    assert parse_configs((TrainConfig, LaunchConfig), ["--data", "d", "--output", "o"])[1] == LaunchConfig()


class _LostExecutorJob:
    """An RDD stand-in whose collect() fails as Spark 4.0 fails a barrier job whose executor died."""

    def __init__(self, text):
        self.text = text

    def collect(self):
        raise RuntimeError(self.text)


# Executor id -> host as Spark's status store holds them (executor_id_hosts): only a text that names
# no host is looked up there, so the texts that name one are checked against a store that disagrees.
EXECUTORS = {"1": "10.77.0.99", "3": "10.77.0.15", "driver": "10.77.0.1"}
BARRIER_ABORT = ("Job aborted due to stage failure: Could not recover from a failed barrier ResultStage. Most recent "
                 "failure reason: Stage failed because barrier task ResultTask(0, 1) finished unsuccessfully.\n"
                 "ExecutorLostFailure (executor {} exited caused by one of the running tasks) Reason: Command exited "
                 "with code 137")


@pytest.mark.parametrize("text, host", [
    ("Job aborted due to stage failure: Could not recover from a failed barrier ResultStage. Most recent failure "
     "reason: ExecutorLostFailure (executor 1 exited unrelated to the running tasks) Reason: worker lost: "
     "10.77.0.15:42255 got disassociated", "10.77.0.15"),
    ("Lost task 1.0 in stage 0.0 (TID 1) (10.77.0.15 executor 3): ExecutorLostFailure (executor 3 exited caused "
     "by one of the running tasks) Reason: Remote RPC client disassociated.", "10.77.0.15"),
    (BARRIER_ABORT.format(3), "10.77.0.15"),  # names the executor only (seen on the test hosts)
])
def test_a_lost_executor_names_its_host_and_the_rank_that_ran_there(text, host):
    from pipelines.launch.barrier import collect_tasks, lost_host

    assert lost_host(text, lambda: EXECUTORS) == host
    with pytest.raises(HorovodJobFailed) as failed:
        collect_tasks(_LostExecutorJob(text), {0: "10.77.0.14", 1: host, 2: "10.77.0.16"}, lambda: EXECUTORS)
    (failure,) = failed.value.failures
    assert (failure.rank, failure.host, failure.lost) == (1, host, True)
    assert str(failed.value).startswith(f"rank 1 on {host} failed: Spark executor lost: ExecutorLostFailure (executor")
    with pytest.raises(HorovodJobFailed, match=r"^rank -1 on 10.77.0.15 failed"):  # no rank reported that host
        collect_tasks(_LostExecutorJob(text), {0: "10.77.0.14"}, lambda: EXECUTORS)


def test_a_lost_executor_unknown_to_the_status_store_is_still_a_lost_rank_failure():
    from pipelines.launch.barrier import collect_tasks, lost_host

    assert lost_host(BARRIER_ABORT.format(3)) == "" and lost_host(BARRIER_ABORT.format(7), lambda: EXECUTORS) == ""
    with pytest.raises(HorovodJobFailed) as failed:
        collect_tasks(_LostExecutorJob(BARRIER_ABORT.format(7)), {0: "10.77.0.14"}, lambda: EXECUTORS)
    (failure,) = failed.value.failures
    assert (failure.rank, failure.host, failure.lost) == (-1, "", True)
    assert str(failed.value) == ("rank -1 failed: Spark executor lost: ExecutorLostFailure (executor 7 exited caused "
                                 "by one of the running tasks) Reason: Command exited with code 137")


@pytest.mark.parametrize("size, names", [(1, ["0", "0"]), (2, ["0", "1"]), (10, ["0", "9"]), (11, ["00", "10"]),
                                         (101, ["000", "100"])])
def test_rank_log_folders_are_named_as_horovod_names_them_and_for_one_rank(size, names):
    from pipelines.launch.local import pad_rank
    assert [pad_rank(0, size), pad_rank(size - 1, size)] == names
    if size > 1:  # Horovod's own formula, where it works
        from horovod.runner.gloo_run import _pad_rank as horovods
        assert [horovods(0, size), horovods(size - 1, size)] == names


@pytest.mark.parametrize("address, parts", [
    ("[0:0:0:0:0:0:0:1]:40123", ("0:0:0:0:0:0:0:1", "40123")), ("[fe80::1]:7077", ("fe80::1", "7077")),
    ("10.0.0.1:7077", ("10.0.0.1", "7077")), ("worker-1.example:35000", ("worker-1.example", "35000")),
])
def test_spark_addresses_split_into_a_bare_host_and_a_port(address, parts):
    from pipelines.launch.network import join_host_port, split_host_port
    assert split_host_port(address) == parts
    assert split_host_port(join_host_port(*parts)) == parts


@pytest.mark.parametrize("host", ["[0:0:0:0:0:0:0:1]", "::1", "[::1]"])
def test_an_ipv6_host_resolves_and_is_refused_naming_the_rendezvous_limit(host):
    from pipelines.launch.network import rendezvous_ipv4
    assert resolve(host) == "::1"
    assert interface_of(host, interfaces=IFACES) == "lo"
    with pytest.raises(ValueError, match=r"no IPv4 address \(it resolves to ::1\): Horovod's Gloo rendezvous is "
                                         r"IPv4 only; .*SPARK_LOCAL_IP=127\.0\.0\.1"):
        rendezvous_ipv4(host)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.1.1", "localhost"])
def test_ipv4_hosts_pass_the_rendezvous_check(host):
    from pipelines.launch.network import rendezvous_ipv4
    assert rendezvous_ipv4(host).startswith("127.")


def test_sessions_this_product_starts_serve_no_ui_and_a_local_master_on_loopback_alone():
    """The web UI (every interface, the job's environment, links that kill jobs) is off unless
    asked, never with its kill links; a local master's driver listens on 127.0.0.1 unless the user
    chose an address (SPARK_LOCAL_IP); a cluster's master leaves the driver's address to Spark."""
    from pipelines.runtime.spark import service_conf
    off = {"spark.ui.enabled": "false", "spark.ui.killEnabled": "false"}
    loopback = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    for master in ("local", "local[*]", "local[2]", "local[2,3]"):
        assert service_conf(master, {}) == {**off, **loopback}
        assert service_conf(master, {"SPARK_LOCAL_IP": "127.0.1.1"}) == off
    for master in ("spark://10.0.0.1:7077", "local-cluster[2,1,1024]", "yarn", "k8s://https://10.0.0.1:6443"):
        assert service_conf(master, {}) == off


DRIVER = '''
import os, signal, subprocess, sys, time
sys.path.insert(0, {repo!r})
from pipelines.launch.local import passing_on_sigterm
RANK = """
import sys, time
sys.path.insert(0, {repo!r})
from pipelines.training import preemption
with preemption.PreemptionNotice(rank=int(sys.argv[1])) as notice:
    print("ready", flush=True)
    deadline = time.monotonic() + 30
    while not notice.requested and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # a repeat of the notice arrives meanwhile: the same notice
    sys.exit(76 if notice.requested else 1)
"""
ranks = []
with passing_on_sigterm(ranks):
    for r in range(2):
        ranks.append(subprocess.Popen([sys.executable, "-c", RANK, str(r)], stdout=subprocess.PIPE, text=True))
    for proc in ranks:
        proc.stdout.readline()
    print("ranks ready", flush=True)
    codes = [proc.wait() for proc in ranks]
print("codes", codes, flush=True)
sys.exit(max(codes))
'''


@pytest.mark.parametrize("to_group", [True, False])
def test_a_sigterm_to_the_launching_driver_reaches_each_rank_once_and_the_driver_ends_as_they_do(to_group):
    """A driver of local ranks (run_local's handler): SIGTERM to the whole process group (a
    machine's shutdown: driver and ranks at once) or to the driver alone; each rank sees one
    notice (its repeat within the window is the same one), ends 76, and so does the driver."""
    import os
    import signal
    import subprocess
    import sys

    from tests.support.env import REPO

    driver = subprocess.Popen([sys.executable, "-c", DRIVER.format(repo=REPO)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert driver.stdout.readline() == "ranks ready\n"
        (os.killpg if to_group else os.kill)(driver.pid, signal.SIGTERM)
        out, err = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 76 and out == "codes [76, 76]\n", (driver.returncode, out, err)
    assert "SIGTERM received: passed on to every rank" in err
    assert err.count("SIGTERM received: every rank checkpoints") == 2  # one notice per rank
