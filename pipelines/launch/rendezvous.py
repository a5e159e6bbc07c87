"""Gloo's rendezvous on one address (loopback, or task 0's host), answering only the job's token (else 403)."""
from __future__ import annotations

import secrets
import threading
from typing import List, Set, Tuple

GLOBAL_SCOPE = "global"  # Horovod's Gloo context puts each rank's address under its rank there
FORBIDDEN = 403


def gloo_address(address: str, port: "int | str", token: str) -> str:
    """``HOROVOD_GLOO_RENDEZVOUS_ADDR`` for the rendezvous at ``address:port``: ``ADDR:PORT/TOKEN``.

    Horovod's client appends ``:`` and the port, so request paths start ``/TOKEN:PORT/``."""
    return f"{address}:{port}/{token}"


class Rendezvous:
    """Horovod's Gloo rendezvous HTTP store on ``address`` (127.0.0.1, or where other hosts reach this one).

    Raises:
        OSError: ``address`` is not an address of this machine."""

    def __init__(self, address: str, host_counts: List[Tuple[str, int]], world_size: int):
        # in the function: `import pipelines` stays free of Horovod (and, through it, of TensorFlow)
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        class Handler(RendezvousHandler):  # keeps which ranks put their address: Horovod clears its own at the end
            def _put_value(self, scope, key, value):
                if scope == GLOBAL_SCOPE and key.isdigit():
                    joined.add(int(key))
                return super()._put_value(scope, key, value)

            def _holds_token(self) -> bool:
                """Whether the path starts with the job's token (then stripped); else answer 403."""
                head, _, rest = self.path.partition("/")[2].partition("/")
                if not secrets.compare_digest(head.encode(), f"{token}:{self.server.server_address[1]}".encode()):
                    self.send_status_code(FORBIDDEN)
                    return False
                self.path: str = "/" + rest
                return True

            def do_GET(self):
                if self._holds_token():
                    super().do_GET()

            def do_PUT(self):
                if self._holds_token():
                    super().do_PUT()

            def do_DELETE(self):
                if self._holds_token():
                    super().do_DELETE()

        token = self.token = secrets.token_urlsafe(24)
        joined: Set[int] = set()
        self._joined = joined
        self._world_size = world_size
        self._httpd = RendezvousHTTPServer((address, 0), Handler, 0)
        plan = ",".join(f"{host}:{n}" for host, n in host_counts)
        self._httpd.init(get_host_assignments(parse_hosts(plan), world_size))
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="gloo-rendezvous", daemon=True)
        self._thread.start()

    def missing(self) -> List[int]:
        """The ranks that never put their address in Gloo's global scope: started too late, or not at all."""
        return sorted(set(range(self._world_size)) - self._joined)

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()
