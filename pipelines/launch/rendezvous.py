"""Gloo's rendezvous for a job's ranks, on one address: loopback for local ranks, task 0's host on
Spark, answering only requests that carry the job's token.

Horovod's own ``RendezvousServer.start`` (0.28.1) binds through ``horovod.runner.util.network.find_port``,
which listens on every interface (``''``). :class:`Rendezvous` runs the same HTTP key-value store
(``RendezvousHTTPServer``: the ranks put and get their Gloo addresses; nothing in it is pickled,
nothing of the job is in it) on one IPv4 address and an ephemeral port.

Horovod's store takes no credential, and its C++ client (``HTTPStore``) sends none: its URLs are
``http://`` + ``HOROVOD_GLOO_RENDEZVOUS_ADDR`` + ``:`` + ``HOROVOD_GLOO_RENDEZVOUS_PORT`` + ``/scope/key``.
A per-job token is carried in the path instead: the ranks are given ``ADDR:PORT/TOKEN`` as the
address (:func:`gloo_address`), so every request's path starts ``/TOKEN:PORT/``, and the server
answers 403 to any other (:class:`Rendezvous`). The token is in the ranks' environment alone
(readable by their owner only), never on a command line.
"""
from __future__ import annotations

import secrets
import threading
from typing import List, Set, Tuple

GLOBAL_SCOPE = "global"  # Horovod's Gloo context puts each rank's address under its rank there
FORBIDDEN = 403


def gloo_address(address: str, port: "int | str", token: str) -> str:
    """``HOROVOD_GLOO_RENDEZVOUS_ADDR`` for ranks of the rendezvous at ``address:port`` whose token
    is ``token``: ``ADDR:PORT/TOKEN``, which Horovod's client turns into URLs whose path starts
    ``/TOKEN:PORT/`` (it appends ``:`` and ``HOROVOD_GLOO_RENDEZVOUS_PORT``, the same port)."""
    return f"{address}:{port}/{token}"


class Rendezvous:
    """Horovod's Gloo rendezvous server, listening on ``address`` (an IPv4 address of this machine).

    Args:
        address: where to listen: ``127.0.0.1`` for ranks on this machine alone, else the address
            the other hosts reach this one at.
        host_counts: the ranks' hosts in rank order with their number of ranks, ``[(host, n), ...]``
            (the ``HOROVOD_HOSTNAME`` each rank is given).
        world_size: the number of ranks.

    ``port`` is the port it listens on and ``token`` the job's token, which every request's path
    must start with (:func:`gloo_address`; any other request is answered 403 and stores nothing);
    :meth:`missing` names the ranks that never joined; :meth:`stop` stops it.

    Raises:
        OSError: ``address`` is not an address of this machine.
    """

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
                """Whether the path starts with the job's token (then taken off it); else 403."""
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
        """The ranks that never put their address in Gloo's global scope, in order: the ranks that
        started too late (``HOROVOD_GLOO_TIMEOUT_SECONDS``) or not at all."""
        return sorted(set(range(self._world_size)) - self._joined)

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()
