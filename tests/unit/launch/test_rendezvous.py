"""Gloo's rendezvous answers only requests whose path carries the job's token: Horovod's C++ client
sends none of its own, so the token rides in the address the ranks are given. Real server, real
HTTP requests (the token's route through Horovod's client: tests/ranks/test_launcher.py's jobs)."""
import http.client

import pytest

from pipelines.launch.rendezvous import Rendezvous, gloo_address


@pytest.fixture
def server():
    rendezvous = Rendezvous("127.0.0.1", [("h", 2)], 2)
    yield rendezvous
    rendezvous.stop()


def request(server, method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request(method, path, body=body, headers={"Content-Length": str(len(body or b""))})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def rank_path(server, token, rest):
    """The path Horovod's client asks for: its URL is http:// + ADDR + ':' + PORT + '/' + rest."""
    url = "http://" + gloo_address("127.0.0.1", server.port, token) + ":" + str(server.port) + "/" + rest
    return url.split(str(server.port), 1)[1]


def test_a_rank_with_the_token_puts_and_gets_its_address(server):
    assert rank_path(server, server.token, "global/0") == f"/{server.token}:{server.port}/global/0"
    assert request(server, "PUT", rank_path(server, server.token, "global/0"), b"addr-0")[0] == 200
    assert request(server, "GET", rank_path(server, server.token, "global/0")) == (200, b"addr-0")
    assert server.missing() == [1]


@pytest.mark.parametrize("path", [
    "/global/0",  # Horovod's own form: no token
    "/{wrong}:{port}/global/0",  # another job's token
    "/{token}:1/global/0",  # the token with another port
    "/{token}/global/0",  # the token without the port
    "/{token}{port}/global/0",
    "/x{token}:{port}/global/0",
    "//global/0",
    "/",
])
def test_a_request_without_the_jobs_token_is_refused_and_stores_or_reads_nothing(server, path):
    path = path.format(token=server.token, port=server.port, wrong=Rendezvous.__name__ + "0" * 32)
    assert request(server, "PUT", rank_path(server, server.token, "global/1"), b"addr-1")[0] == 200
    assert request(server, "PUT", path, b"planted")[0] == 403
    assert request(server, "GET", path)[0] == 403
    assert request(server, "DELETE", path)[0] == 403
    assert request(server, "GET", rank_path(server, server.token, "global/1")) == (200, b"addr-1")
    assert request(server, "GET", rank_path(server, server.token, "global/0"))[0] == 404
    assert server.missing() == [0]


def test_each_rendezvous_has_its_own_token(server):
    other = Rendezvous("127.0.0.1", [("h", 1)], 1)
    try:
        assert other.token != server.token and len(server.token) >= 32
        assert request(other, "GET", f"/{server.token}:{other.port}/global/0")[0] == 403
    finally:
        other.stop()
