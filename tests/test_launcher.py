"""HorovodRunner's pure parts and its local mode (child processes of the driver, Gloo over loopback)."""
import os
import socket

import pytest

from pipelines.launch import HorovodJobFailed, HorovodRunner, RankFailure
from pipelines.launch.barrier import rank_plan
from pipelines.launch.local import collect_failures

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


def _kill_rank_1():
    import os
    import signal

    import horovod.tensorflow as hvd
    import numpy as np
    hvd.init()
    if hvd.rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    hvd.allreduce(np.array([1.0]))
    return "unreachable"


@pytest.mark.slow
def test_a_killed_local_rank_is_named_with_its_signal():
    with pytest.raises(HorovodJobFailed,
                       match=rf"^rank 1 on {socket.gethostname()} failed: process killed by signal SIGKILL"):
        HorovodRunner(np=-2).run(_kill_rank_1)


def _rank_sum(offset):
    import horovod.tensorflow as hvd
    hvd.init()
    import numpy as np
    return float(hvd.allreduce(np.array([hvd.rank() + offset], np.float64), op=hvd.Sum).numpy()[0]), hvd.rank()


def _raise_on_rank_1():
    import horovod.tensorflow as hvd
    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank one is broken: password=hunter2")  # an internal error, quoting a secret
    import numpy as np
    hvd.allreduce(np.array([1.0]))
    return "unreachable"


@pytest.mark.slow
def test_local_run_returns_rank_0s_value():
    """With the loopback interface named (the default path runs in the tests below)."""
    assert HorovodRunner(np=-2, network_interface="lo").run(_rank_sum_and_iface, offset=10) == ((21.0, 0), "lo")


def _tuning_env():
    import os
    return {name: os.environ.get(name) for name in ("HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY")}


@pytest.mark.slow
def test_local_ranks_get_the_users_tuning_or_horovods_defaults_not_none_tuples(monkeypatch):
    """Horovod 0.28.1's horovod.runner.run passed HOROVOD_CYCLE_TIME="(None,)" (read as 0 ms: a
    spinning background thread) whatever the launching process had; the ranks must get that
    process's value, or none."""
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "7")
    monkeypatch.delenv("HOROVOD_CACHE_CAPACITY", raising=False)
    assert HorovodRunner(np=-1).run(_tuning_env) == {"HOROVOD_CYCLE_TIME": "7", "HOROVOD_CACHE_CAPACITY": None}
    assert "HOROVOD_RANK" not in os.environ  # the ranks' variables are theirs alone


@pytest.mark.slow
def test_local_failure_names_the_rank_and_the_cause(capfd):
    """The driver gets the failing rank's cause and its whole traceback, redacted; nothing the rank
    printed on its way out (Horovod's task runner prints what propagates) shows the secret."""
    with pytest.raises(HorovodJobFailed,
                       match=rf"rank 1 on {socket.gethostname()} failed: ValueError: rank one is broken") as failed:
        HorovodRunner(np=-2).run(_raise_on_rank_1)
    root = failed.value.failures[0]
    assert not root.refused and not failed.value.refused
    assert root.traceback.startswith("Traceback (most recent call last)") and "in _raise_on_rank_1" in root.traceback
    assert "ValueError: rank one is broken: password=***" in root.traceback
    shown = capfd.readouterr()
    assert "hunter2" not in str(failed.value) + root.traceback + shown.out + shown.err
    assert "rank 1 on" in shown.out + shown.err  # the rank's own last words, with its traceback


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
        HorovodRunner(np=-2).run(_rank_sum, offset=0)
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


# -- Spark settings barrier tasks cannot run under (issue 9, item 5) ----------------------------

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


# -- `from pipelines import HorovodRunner`, lazily ----------------------------------------------

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


# -- end to end: real Spark, real Horovod ---------------------------------------------------------
SPARK_SCRIPT = '''
import sys
from pyspark.sql import SparkSession
from pipelines import HorovodRunner

def rank_sum(offset):
    import os
    import horovod.tensorflow as hvd
    import numpy as np
    hvd.init()
    total = float(hvd.allreduce(np.array([hvd.rank() + offset], np.float64), op=hvd.Sum).numpy()[0])
    return total, hvd.rank(), os.environ["HOROVOD_GLOO_IFACE"], os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"]

if __name__ == "__main__":
    spark = SparkSession.builder.master(sys.argv[1]).config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    print("RESULT", HorovodRunner(np=2).run(rank_sum, offset=10), flush=True)
    if len(sys.argv) > 2:  # the user's interface, used as given although the address is on lo
        print("CHOSEN", HorovodRunner(np=2, network_interface=sys.argv[2]).run(rank_sum, offset=1), flush=True)
'''


@pytest.mark.slow
def test_spark_ranks_on_a_non_default_loopback_address(tmp_path):
    """SPARK_LOCAL_IP=127.0.1.1 (Debian's hostname address): Gloo runs over lo; the rendezvous is
    reached at the address Spark gives task 0."""
    import subprocess
    import sys
    from tests.conftest import subprocess_env
    script = tmp_path / "loopback.py"
    script.write_text(SPARK_SCRIPT)
    other = next(name for name, addresses in local_interfaces().items()  # e.g. eth0
                 if any("." in a and not a.startswith("127.") for a in addresses))
    proc = subprocess.run([sys.executable, str(script), "local[2]", other], capture_output=True, text=True,
                          timeout=300, env=subprocess_env(SPARK_LOCAL_IP="127.0.1.1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESULT (21.0, 0, 'lo', '127.0.1.1')" in proc.stdout
    assert f"CHOSEN (3.0, 0, '{other}', '127.0.1.1')" in proc.stdout


def _rank_sum_and_iface(offset):
    import os
    return _rank_sum(offset), os.environ["HOROVOD_GLOO_IFACE"]


@pytest.mark.slow
@pytest.mark.parametrize("spark_np, how", [(2, "flag"), (-2, "env")])  # Spark tasks / local ranks
def test_train_refuses_a_missing_interface_with_exit_2_before_any_rank(tmp_path, spark_np, how):
    import os
    import subprocess
    import sys
    from tests.conftest import subprocess_env
    from tests.datagen import write_dataset
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    write_dataset(str(tmp_path / "data"), train_groups=[4], test_groups=[2])  # passes the data refusals
    args = [sys.executable, os.path.join(repo, "jobs", "train.py"), "--data", str(tmp_path / "data"),
            "--output", str(tmp_path / "out"), "--spark-np", str(spark_np), "--batch-size", "1"]
    env = subprocess_env(HOROVOD_GLOO_IFACE="nosuch0") if how == "env" else subprocess_env()
    if how == "flag":
        args += ["--network-interface", "nosuch0"]
        env.pop("HOROVOD_GLOO_IFACE", None)
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "network interface 'nosuch0' (HOROVOD_GLOO_IFACE / --network-interface) does not exist on host" in errors[0]
    assert "lo (127.0.0.1" in errors[0]
    assert "barrier tasks on" not in proc.stderr and "rank 0" not in proc.stderr  # no task, no rank started


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


@pytest.mark.slow
def test_the_status_store_names_each_executor_s_host(spark):
    """Real Spark (the session's local master): its one executor is the driver, on the driver's host."""
    from pipelines.launch.sparkcheck import executor_id_hosts

    sc = spark.sparkContext
    assert executor_id_hosts(sc) == {"driver": sc.getConf().get("spark.driver.host")}
    assert executor_id_hosts(sc, active_only=True) == executor_id_hosts(sc)


@pytest.mark.parametrize("size, names", [(1, ["0", "0"]), (2, ["0", "1"]), (10, ["0", "9"]), (11, ["00", "10"]),
                                         (101, ["000", "100"])])
def test_rank_log_folders_are_named_as_horovod_names_them_and_for_one_rank(size, names):
    from pipelines.launch.local import pad_rank
    assert [pad_rank(0, size), pad_rank(size - 1, size)] == names
    if size > 1:  # Horovod's own formula, where it works
        from horovod.runner.gloo_run import _pad_rank as horovods
        assert [horovods(0, size), horovods(size - 1, size)] == names


@pytest.mark.slow
def test_one_local_rank_with_rank_logs_runs_and_keeps_its_log(tmp_path):
    """np=-1 with a log folder (``jobs/train.py --spark-np -1``): Horovod 0.28.1's launcher failed
    with a math domain error before the rank started."""
    assert HorovodRunner(np=-1, log_dir=str(tmp_path)).run(_tuning_env)["HOROVOD_CACHE_CAPACITY"] is None
    assert os.path.isfile(tmp_path / "rank.0" / "stdout")


# -- IPv6: Spark's bracketed literals parse; the refusal names Horovod's IPv4 rendezvous (issue 25 item 9)

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


@pytest.mark.slow
def test_spark_on_ipv6_is_refused_with_exit_2_before_any_task(tmp_path):
    """SPARK_LOCAL_IP=::1 with --spark-np 2: refused as "host '[0:0:0:0:0:0:0:1]' does not resolve" before."""
    import subprocess
    import sys
    from tests.conftest import subprocess_env
    from tests.datagen import write_dataset
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    write_dataset(str(tmp_path / "data"), train_groups=[4], test_groups=[2])
    proc = subprocess.run([sys.executable, os.path.join(repo, "jobs", "train.py"), "--data", str(tmp_path / "data"),
                           "--output", str(tmp_path / "out"), "--spark-np", "2", "--batch-size", "1",
                           "--backbone", "tiny", "--weights", "none"],
                          capture_output=True, text=True, timeout=300, env=subprocess_env(SPARK_LOCAL_IP="::1"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "no IPv4 address" in errors[0] and "Horovod's Gloo rendezvous is IPv4 only" in errors[0]
    assert "does not resolve" not in proc.stderr and "barrier tasks on" not in proc.stderr


# -- what a running job listens on (issue 36, items 1 and 7) ------------------------------------

def _listening(pids):
    """``{(pid, address, port)}`` of the TCP sockets the processes ``pids`` listen on (psutil)."""
    import psutil
    found = set()
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            connections = proc.net_connections(kind="inet") if hasattr(proc, "net_connections") else \
                proc.connections(kind="inet")
        except psutil.Error:  # it ended between the listing and the look
            continue
        found |= {(pid, c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN}
    return found


def _answer(address, port, path):
    """What a listening socket answers to an HTTP ``GET path`` within 2 s (b"" if it says nothing)."""
    with socket.create_connection((address, port), timeout=2) as conn:
        conn.sendall(f"GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n".encode())
        chunks = []
        try:
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except OSError:  # silent (a Gloo pair waits for its peer's bytes), or reset
            pass
        return b"".join(chunks)


@pytest.mark.slow
def test_a_local_training_job_listens_on_loopback_alone_and_serves_no_part_of_its_job(tmp_path):
    """``jobs/train.py --spark-np -2`` while it runs: every socket the driver and its ranks listen
    on is bound to loopback (Horovod's function mode served the pickled job and its config on
    every interface), the driver's Gloo rendezvous and whichever of the ranks' short-lived Gloo pair
    listeners the sampling catches among them, and none
    of the driver's answers an HTTP GET (of ``/``, or of the path Horovod's store served the job
    at) with the config (a marker in its --output) or a pickle. (The ranks' sockets are Gloo's
    pairs: a probe's bytes would break the job.)"""
    import subprocess
    import sys
    import time

    import psutil

    from tests.conftest import subprocess_env
    from tests.datagen import write_dataset

    data, marker = str(tmp_path / "data"), "marker-7f3a9c1e5d"
    write_dataset(data, train_groups=[4, 4], test_groups=[3], size=12, rows_per_group=2)
    out = str(tmp_path / f"out-{marker}")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    job = subprocess.Popen([sys.executable, os.path.join(repo, "jobs", "train.py"), "--data", data, "--output", out,
                            "--weights", "none", "--backbone", "tiny", "--batch-size", "2", "--image-size", "8",
                            "--epochs", "3", "--patience", "5", "--no-tensorboard", "--spark-np", "-2"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=subprocess_env())
    seen, answers, roles = set(), {}, {}
    try:
        while job.poll() is None:
            tree = [job.pid] + [c.pid for c in psutil.Process(job.pid).children(recursive=True)]
            for pid, address, port in _listening(tree) - seen:
                seen.add((pid, address, port))
                roles[pid] = "driver" if pid == job.pid else "rank"
                if pid == job.pid:  # a rank's are Gloo's pairs, which a stray byte would break
                    try:
                        answers[(address, port)] = [_answer(address, port, path) for path in ("/", "/runfunc/func")]
                    except OSError:
                        answers[(address, port)] = []  # closed in between
            time.sleep(0.05)
    finally:
        if job.poll() is None:
            job.kill()
        output = job.communicate()[0].decode(errors="replace")
    assert job.returncode == 0, output[-3000:]
    assert {address for _, address, _ in seen} <= {"127.0.0.1", "::1"}, seen
    # the driver's rendezvous always; Gloo's pair listeners live only until their peer has connected, so
    # a loaded machine's sampling can miss them (every one it saw is on loopback, checked above)
    assert "driver" in roles.values(), (seen, roles)
    for (address, port), replies in answers.items():
        for reply in replies:
            body = reply.split(b"\r\n\r\n", 1)[-1]
            assert marker.encode() not in reply and not body.startswith((b"\x80\x04", b"\x80\x05")), \
                (address, port, reply[:200])


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


@pytest.mark.slow
def test_the_suites_own_session_has_no_ui_and_its_driver_on_loopback(spark):
    """Real Spark: the session spark_session started (tests/conftest.py, local[2])."""
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.ui.enabled") == "false" and conf.get("spark.ui.killEnabled") == "false"
    assert spark.sparkContext.uiWebUrl is None
    if not os.environ.get("SPARK_LOCAL_IP"):
        assert conf.get("spark.driver.host") == conf.get("spark.driver.bindAddress") == "127.0.0.1"
