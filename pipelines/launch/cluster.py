"""A Spark standalone cluster on this machine, from the pyspark package alone.

``python -m pipelines.launch.cluster --workers 2 --cores 1 --memory 2g`` (Ctrl-C stops it); submit with the
printed ``SPARK_CONF_DIR`` set, whose ``spark-defaults.conf`` holds the cluster's secret (never a command line)."""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from pipelines.runtime.errors import Refused
from pipelines.runtime.logs import plural

DEFAULTS = "spark-defaults.conf"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def spark_home() -> str:
    """The pyspark package folder, which ships ``bin/spark-class`` and ``jars/``."""
    import pyspark  # in the function: `import pipelines` stays free of PySpark

    return os.path.dirname(pyspark.__file__)


@dataclass(frozen=True)
class Place:
    """Where a cluster process runs: ``address``, ``command`` (a prefix that starts a process there; empty: here)."""

    address: str
    command: Tuple[str, ...] = ()
    work_dir: Optional[str] = None


class StandaloneCluster:
    """Master + ``workers`` workers on ``host``; a context manager that always stops them.

    ``conf_dir`` is the drivers' ``SPARK_CONF_DIR``, holding the cluster's secret."""

    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "2g", host: str = "127.0.0.1",
                 work_dir: Optional[str] = None, timeout_s: float = 120.0,
                 env: Optional[Dict[str, str]] = None, master_at: Optional[Place] = None,
                 workers_at: Optional[Sequence[Place]] = None):
        self.worker_places = list(workers_at) if workers_at else [None] * workers
        if not self.worker_places or cores < 1:
            raise Refused("a cluster needs at least one worker with at least one core")
        self.workers, self.cores, self.memory, self.host = len(self.worker_places), cores, memory, host
        self.master_place = master_at
        self.timeout_s = timeout_s
        self.extra_env = dict(env or {})  # for the workers' own environment, which executors inherit
        self._own_dir = work_dir is None
        self.work_dir = work_dir or tempfile.mkdtemp(prefix="spark-standalone-")
        master = master_at.address if master_at else host
        self.port, self.web_port = (7077, 8080) if master_at else (free_port(host), free_port(host))
        self.url = f"spark://{master}:{self.port}"
        self.web_url = f"http://{master}:{self.web_port}"
        self.processes: List[subprocess.Popen] = []
        self.conf_dir = os.path.join(self.work_dir, "conf")

    @property
    def client_env(self) -> Dict[str, str]:
        """The variables a driver of this cluster needs: ``SPARK_CONF_DIR``, which holds the cluster's secret."""
        return {"SPARK_CONF_DIR": self.conf_dir}

    def _write_conf(self) -> None:
        """Make ``conf_dir`` (owner-only): the user's Spark conf folder copied, with this cluster's secret added."""
        os.makedirs(self.conf_dir, mode=0o700, exist_ok=True)
        os.chmod(self.conf_dir, 0o700)
        source = self.extra_env.get("SPARK_CONF_DIR") or os.environ.get("SPARK_CONF_DIR") or \
            os.path.join(spark_home(), "conf")
        defaults = ""
        if os.path.isdir(source):
            for name in os.listdir(source):
                path = os.path.join(source, name)
                if name == DEFAULTS:
                    with open(path) as f:
                        defaults = f.read()
                elif os.path.isfile(path):
                    shutil.copy(path, self.conf_dir)
        secret = secrets.token_hex(32)
        fd = os.open(os.path.join(self.conf_dir, DEFAULTS), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(defaults.rstrip("\n") + "\n# this cluster's (pipelines.launch.cluster): every connection "
                    "authenticated; no kill links in the web UIs\n"
                    f"spark.authenticate true\nspark.authenticate.secret {secret}\nspark.ui.killEnabled false\n")

    def _env(self) -> dict:
        env = dict(os.environ, SPARK_HOME=spark_home(), SPARK_LOCAL_IP=self.host,
                   SPARK_LOG_DIR=os.path.join(self.work_dir, "logs"), PYSPARK_PYTHON=sys.executable,
                   SPARK_NO_DAEMONIZE="1", **self.extra_env, **self.client_env)
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        return env

    def _spawn(self, name: str, args: List[str], place: Optional[Place]) -> None:
        log_path = os.path.join(self.work_dir, f"{name}.log")
        env = self._env()
        if place:
            env["SPARK_LOCAL_IP"] = place.address
        with open(log_path, "ab") as log:  # a restarted worker appends
            self.processes.append(subprocess.Popen(
                [*(place.command if place else ()), os.path.join(spark_home(), "bin", "spark-class"), *args],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def _start_worker(self, i: int, place: Optional[Place]) -> None:
        worker_dir = (place and place.work_dir) or os.path.join(self.work_dir, f"worker-{i}")
        os.makedirs(worker_dir, exist_ok=True)
        host = place.address if place else self.host
        self._spawn(f"worker-{i}", ["org.apache.spark.deploy.worker.Worker", "--host", host,
                                    "--cores", str(self.cores), "--memory", self.memory,
                                    "--webui-port", str(8081 if place else free_port(host)),
                                    "--work-dir", worker_dir, self.url], place)

    def restart_worker(self, *indices: int) -> None:
        """Start the workers ``indices`` (0-based) again and return once the master lists every worker alive.

        Raises:
            RuntimeError: not every worker registered within ``timeout_s``."""
        for i in indices:
            self._start_worker(i, self.worker_places[i])
        deadline = time.monotonic() + self.timeout_s
        while self.alive_workers() < self.workers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers {', '.join(map(str, indices))} did not register again "
                                   f"({self.alive_workers()}/{self.workers} alive):\n{self._log_tails()}")
            time.sleep(0.5)

    def alive_workers(self) -> int:
        """Workers the master lists as ALIVE (0 while the master is not answering)."""
        try:
            with urllib.request.urlopen(self.web_url + "/json/", timeout=2) as response:
                state = json.load(response)
        except (OSError, ValueError):
            return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def start(self) -> "StandaloneCluster":
        """Start the master and the workers; return once all workers are registered.

        Raises:
            RuntimeError: not all registered within ``timeout_s`` (log tails included); all is stopped first."""
        os.makedirs(os.path.join(self.work_dir, "logs"), exist_ok=True)
        self._write_conf()
        master = self.master_place.address if self.master_place else self.host
        self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", master,
                               "--port", str(self.port), "--webui-port", str(self.web_port)], self.master_place)
        for i, place in enumerate(self.worker_places):
            self._start_worker(i, place)
        deadline = time.monotonic() + self.timeout_s
        while self.alive_workers() < self.workers:
            dead = [p for p in self.processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                tails = self._log_tails()
                self.stop()
                raise RuntimeError(f"Spark standalone cluster did not come up ({self.alive_workers()}/"
                                   f"{plural(self.workers, 'worker')} registered):\n{tails}")
            time.sleep(0.5)
        return self

    def _log_tails(self, lines: int = 15) -> str:
        out = []
        for name in sorted(os.listdir(self.work_dir)):
            if name.endswith(".log"):
                with open(os.path.join(self.work_dir, name), errors="replace") as f:
                    out.append(f"--- {name}\n" + "".join(f.readlines()[-lines:]))
        return "\n".join(out)

    def stop(self) -> None:
        """Stop workers, then the master (SIGTERM, then SIGKILL after 10 s); idempotent."""
        for proc in reversed(self.processes):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.processes):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.processes = []

    def __enter__(self) -> "StandaloneCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)


def main(argv=None) -> int:
    """Run a cluster in the foreground until Ctrl-C or SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument("--memory", default="2g", help="memory per worker (executors + overhead)")
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with StandaloneCluster(args.workers, args.cores, args.memory, args.host) as cluster:
        print(f"master {cluster.url} (web UI {cluster.web_url}), {plural(args.workers, 'worker')} x "
              f"{plural(args.cores, 'core')} x {args.memory}; Ctrl-C stops it\n"
              f"its drivers need: export SPARK_CONF_DIR={cluster.conf_dir}", flush=True)
        try:
            while all(p.poll() is None for p in cluster.processes):
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
