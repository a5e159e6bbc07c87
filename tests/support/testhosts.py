"""Test hosts for pytest: ``scripts/testhosts.sh`` (the one definition of the hosts: namespaces,
bridge, addresses, each host's folders) driven from Python, and a refusal check that turns a
machine without network namespaces into a skip that prints the machine's own error.
"""
from __future__ import annotations

import os
import subprocess
import uuid
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from tests.support.env import REPO

SCRIPT = os.path.join(REPO, "scripts", "testhosts.sh")


@dataclass(frozen=True)
class Host:
    """One test host: ``name`` (h1..hN), its network namespace (also its hostname), its address on
    the bridge (``eth0``), the address of its unroutable ``eth1``, and its own folder."""

    name: str
    netns: str
    address: str
    unroutable: str
    folder: str


class TestHosts:
    """``N`` hosts made by ``scripts/testhosts.sh up N`` under a prefix unique to this object;
    :meth:`down` removes them (and kills whatever runs on them). ``driver`` is this machine's
    address on the bridge, where every host reaches it."""

    def __init__(self, count: int, prefix: Optional[str] = None):
        self.prefix = prefix or "t" + uuid.uuid4().hex[:7]
        table = self._script("up", str(count)).splitlines()
        rows = [line.split() for line in table if line.strip()]
        self.driver = next(row[2] for row in rows if row[0] == "driver")
        self.hosts: List[Host] = [Host(*row) for row in rows if row[0] != "driver"]

    def _script(self, *args: str) -> str:
        proc = subprocess.run([SCRIPT, "-p", self.prefix, *args], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"testhosts.sh {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout

    def command(self, host: Host) -> List[str]:
        """The prefix that runs a command on ``host`` (``testhosts.sh exec``)."""
        return [SCRIPT, "-p", self.prefix, "exec", host.name]

    def run(self, host: Host, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` on ``host`` to its end (``subprocess.run`` keywords)."""
        return subprocess.run([*self.command(host), *argv], **kwargs)

    def by_netns_inode(self) -> Dict[int, Host]:
        """Host by the inode of its network namespace (what ``/proc/PID/ns/net`` of its processes is)."""
        return {os.stat(f"/run/netns/{h.netns}").st_ino: h for h in self.hosts}

    def down(self) -> None:
        self._script("down")


def refusal() -> Optional[str]:
    """Why this machine cannot make test hosts (not root; ``ip netns add`` refused, with its own
    error), or None when it can."""
    if os.geteuid() != 0:
        return f"test hosts need root (network namespaces, a bridge); running as uid {os.geteuid()}"
    probe = "tprobe" + uuid.uuid4().hex[:6]
    try:
        proc = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    except OSError as exc:
        return f"cannot run ip: {exc}"
    if proc.returncode != 0:
        return f"ip netns add refused: {proc.stderr.strip() or proc.returncode}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None
