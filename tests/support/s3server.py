"""A real S3 API server for the tests: ``moto_server`` (moto[server], the server s3fs's own test
suite runs against) started as a process on a free port of 127.0.0.1.

The suite's server accepts any credentials and is reached the standard way: ``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and ``AWS_DEFAULT_REGION`` are set in this
process's environment when conftest is imported, before Spark or any child process starts, so
Spark's Python workers, ``horovodrun`` ranks and notebook kernels inherit them.
:func:`authenticated_server` starts a second one that checks credentials (moto's IAM), for the
wrong-credentials refusals.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Sequence

BIN = os.path.dirname(sys.executable)
ACCESS_KEY = SECRET_KEY = "pipelines-tests"
REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    """A running ``moto_server``: its ``endpoint`` URL, the process, and its log file."""

    endpoint: str
    process: subprocess.Popen
    log: str

    def client(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=access_key, aws_secret_access_key=secret_key)

    def bucket(self, prefix: str = "test", **keys: str) -> str:
        """Create a fresh bucket (a unique name starting with ``prefix``) and return its name."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.client(**keys).create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        if self.process.poll() is None:
            self.process.kill()


def start(port: int, log: str, env: Optional[Dict[str, str]] = None, host: str = "127.0.0.1",
          command: Sequence[str] = ()) -> Server:
    """Start ``moto_server`` on ``host:port`` and wait (at most 30 s) until it answers. ``command``
    is a prefix that starts it elsewhere (e.g. on a test host: ``testhosts.sh exec h2``).

    Raises:
        RuntimeError: it exited or did not answer; the message holds the end of its log.
    """
    with open(log, "ab") as out:
        process = subprocess.Popen([*command, os.path.join(BIN, "moto_server"), "-H", host, "-p", str(port)],
                                   stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    endpoint = f"http://{host}:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=2).close()
            return Server(endpoint, process, log)
        except OSError:
            time.sleep(0.1)
    process.kill()
    with open(log, errors="replace") as f:
        tail = f.read()[-2000:]
    raise RuntimeError(f"moto_server on {endpoint} did not start:\n{tail}")


def standard_environment(endpoint: str) -> Dict[str, str]:
    """The ``AWS_*`` variables through which every client here (pyarrow, boto3) finds the server."""
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true"}


@contextlib.contextmanager
def authenticated_server(log: str) -> Iterator[tuple]:
    """A ``moto_server`` that checks credentials: yields ``(server, access_key, secret_key, bucket)``
    for an IAM user allowed ``s3:*`` who owns ``bucket``. Any other key is refused (403)."""
    # moto lets the first N requests through unauthenticated: the three IAM calls below.
    server = start(free_port(), log, env={"INITIAL_NO_AUTH_ACTION_COUNT": "3"})
    try:
        import boto3

        iam = boto3.client("iam", endpoint_url=server.endpoint, region_name=REGION,
                           aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
        iam.create_user(UserName="pipelines")
        iam.put_user_policy(UserName="pipelines", PolicyName="s3", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="pipelines")["AccessKey"]
        bucket = server.bucket("auth", access_key=key["AccessKeyId"], secret_key=key["SecretAccessKey"])
        yield server, key["AccessKeyId"], key["SecretAccessKey"], bucket
    finally:
        server.stop()
