"""Replicas found by DNS: a Kubernetes headless Service's name resolves to one address per ready
pod, so re-resolving it is how the gateway and the autoscaler follow pods that come and go.

`dns://NAME:PORT` names such a set; `resolve` turns it into upstream URLs. No surge imports: the
gateway and the autoscaler both use it.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True, slots=True)
class DnsTarget:
    host: str
    port: int
    scheme: str = "http"  # of the URLs it resolves to

    @classmethod
    def parse(cls, text: str) -> DnsTarget:
        """`dns://name:port` (e.g. `dns://surge-replicas.default.svc.cluster.local:8000`)."""
        parts = urlsplit(text)
        if parts.scheme != "dns" or not parts.hostname or parts.port is None:
            raise ValueError(f"expected dns://NAME:PORT, got {text!r}")
        return cls(parts.hostname, parts.port)


def _url(scheme: str, address: str, port: int) -> str:
    host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    return f"{scheme}://{host}:{port}"


# The name exists but has no address, or does not exist: a Service scaled to zero has none.
_NO_ADDRESS = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


def resolve(target: DnsTarget) -> tuple[str, ...]:
    """Every address the name has now, as sorted unique URLs; () when it has none (a Service
    scaled to zero: NXDOMAIN or no records). A failure to ask (EAI_AGAIN: the DNS server did
    not answer) raises `socket.gaierror` (an OSError), so that a caller keeps the replicas it
    knows rather than dropping them all for one lost packet. Blocking: call it from a thread."""
    try:
        infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        if e.errno in _NO_ADDRESS:
            return ()
        raise
    addresses = {str(info[4][0]) for info in infos}
    return tuple(sorted(_url(target.scheme, a, target.port) for a in addresses))
