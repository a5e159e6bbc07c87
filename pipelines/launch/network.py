"""Which network interface Gloo uses on each host: the user's, else the one carrying the host's address."""
from __future__ import annotations

import ipaddress
import socket
from typing import Dict, List, Optional, Tuple

import psutil

from pipelines.runtime.errors import Refused

GLOO_IFACE_ENV = "HOROVOD_GLOO_IFACE"


def local_interfaces() -> Dict[str, List[str]]:
    """This machine's network interfaces: name -> its IPv4 and IPv6 addresses."""
    families = (socket.AF_INET, socket.AF_INET6)
    return {name: [a.address.split("%")[0] for a in addresses if a.family in families]
            for name, addresses in psutil.net_if_addrs().items()}


def bare_host(host: str) -> str:
    """``host`` without the brackets of an IPv6 literal (``[::1]`` -> ``::1``)."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def split_host_port(address: str) -> Tuple[str, str]:
    """``HOST:PORT`` -> ``(HOST, PORT)``, the host bare: ``[::1]:7077`` -> ``('::1', '7077')``; no port gives ``''``."""
    if ":" not in address or (address.startswith("[") and address.endswith("]")):
        return bare_host(address), ""
    host, port = address.rsplit(":", 1)
    return bare_host(host), port


def join_host_port(host: str, port: object) -> str:
    """``HOST:PORT``, an IPv6 host in brackets: the inverse of ``split_host_port``."""
    host = bare_host(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def resolve(host: str) -> str:
    """The IP address ``host`` resolves to, IPv4 preferred (Gloo's choice).

    Raises:
        ValueError: ``host`` does not resolve."""
    try:
        infos = socket.getaddrinfo(bare_host(host), None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        raise Refused(f"host {host!r} does not resolve to an address: {exc}") from None
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    return str(infos[0][4][0])


def rendezvous_ipv4(host: str) -> str:
    """The IPv4 address of a rank's ``host``: Horovod 0.28.1's rendezvous server listens on IPv4 alone.

    Raises:
        ValueError: ``host`` does not resolve, or only to IPv6 (the message names the setting to change)."""
    address = resolve(host)
    if ipaddress.ip_address(address).version != 4:
        raise Refused(f"host {host} has no IPv4 address (it resolves to {address}): Horovod's Gloo rendezvous "
                      f"is IPv4 only; give Spark an IPv4 address on every host (SPARK_LOCAL_IP=127.0.0.1 on one "
                      f"machine, else the host's IPv4 address)")
    return address


def _listing(interfaces: Dict[str, List[str]]) -> str:
    return ", ".join(f"{name} ({' '.join(addresses) or 'no address'})"
                     for name, addresses in sorted(interfaces.items()))


def interface_of(host: str, requested: Optional[str] = None,
                 interfaces: Optional[Dict[str, List[str]]] = None) -> str:
    """The network interface Gloo should use for ``host``: ``requested`` as is, else the one carrying its address.

    Raises:
        ValueError: the requested interface does not exist, ``host`` does not resolve, or no interface carries
            its address; the message lists the interfaces."""
    interfaces = local_interfaces() if interfaces is None else interfaces
    if requested:
        if requested not in interfaces:
            raise Refused(f"network interface {requested!r} ({GLOO_IFACE_ENV} / --network-interface) "
                          f"does not exist on host {host}; its interfaces: {_listing(interfaces)}")
        return requested
    address = ipaddress.ip_address(resolve(host))
    matches = [name for name, addresses in interfaces.items()
               if any(_same_or_loopback(address, a) for a in addresses)]
    if matches:
        return sorted(matches, key=lambda name: name != "lo")[0]
    raise Refused(f"no network interface of host {host} has its address {address} (interfaces: "
                  f"{_listing(interfaces)}); set SPARK_LOCAL_IP to one of these addresses, or name the "
                  f"interface with --network-interface / {GLOO_IFACE_ENV}")


def _same_or_loopback(address, other: str) -> bool:
    """``address`` equals ``other``, or both are loopback addresses."""
    try:
        candidate = ipaddress.ip_address(other)
    except ValueError:
        return False
    if address.is_loopback and candidate.is_loopback:  # Gloo binds by name: lo serves both versions
        return True
    return candidate == address


def is_this_machine(host: str) -> bool:
    """Whether ``host`` resolves to a loopback address or an address of this machine's interfaces."""
    try:
        address = resolve(host)
    except ValueError:
        return False
    mine = {a for addresses in local_interfaces().values() for a in addresses}
    return ipaddress.ip_address(address).is_loopback or address in mine


def local_interface(requested: Optional[str], interfaces: Optional[Dict[str, List[str]]] = None) -> Optional[str]:
    """The user's interface for local ranks, which must carry 127.0.0.1; None when none is named (``lo``).

    Raises:
        ValueError: the interface does not exist, or does not carry 127.0.0.1."""
    if not requested:
        return None
    interfaces = local_interfaces() if interfaces is None else interfaces
    iface = interface_of("localhost", requested, interfaces)
    addresses = interfaces[iface]
    if "127.0.0.1" not in addresses:
        raise Refused(f"network interface {iface!r} ({' '.join(addresses) or 'no address'}) cannot carry local "
                      f"ranks (np < 0): they talk over the interface of 127.0.0.1 alone; "
                      f"unset {GLOO_IFACE_ENV} / --network-interface, or name that interface")
    return iface
