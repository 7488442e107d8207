"""Service URLs: `pulsar://host:port[,host:port...]`."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PORT = 6650


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """A broker as the client names it: `logical` is the URL string (the connection pool's
    key, as the C++ client keys it), `host`/`port` where the TCP connection goes."""

    logical: str
    host: str
    port: int


def parse_service_url(url: str) -> list[BrokerAddress]:
    """The brokers of a service URL (ValueError if it is not a plain `pulsar://` URL)."""
    if not isinstance(url, str):
        raise TypeError(f"the service URL is a string, not {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("pulsar", "pulsar+ssl"):
        raise ValueError(f"invalid service URL {url!r}: expected pulsar://host:port")
    if scheme == "pulsar+ssl":
        raise ValueError(f"invalid service URL {url!r}: TLS (pulsar+ssl://) is not supported")
    rest = rest.rstrip("/")
    if not rest or "/" in rest:
        raise ValueError(f"invalid service URL {url!r}: expected pulsar://host:port")
    addresses = []
    for hostport in rest.split(","):
        addresses.append(_parse_host_port(url, hostport))
    return addresses


def parse_broker_url(url: str) -> BrokerAddress:
    """One broker URL, as a LOOKUP_RESPONSE names it."""
    addresses = parse_service_url(url)
    if len(addresses) != 1:
        raise ValueError(f"invalid broker URL {url!r}: expected one host")
    return addresses[0]


def _parse_host_port(url: str, hostport: str) -> BrokerAddress:
    if hostport.startswith("["):                       # [::1]:6650
        host, bracket, tail = hostport[1:].partition("]")
        port_text = tail[1:] if tail.startswith(":") else ""
        if not bracket or (tail and not tail.startswith(":")):     # "[::1:6650" is another address
            raise ValueError(f"invalid service URL {url!r}: bad address {hostport!r}")
    else:
        host, _, port_text = hostport.partition(":")
    if not host or any(ch.isspace() for ch in host):
        raise ValueError(f"invalid service URL {url!r}: missing or bad host in {hostport!r}")
    if port_text:
        # ASCII digits only: str.isdigit takes "²" (int() refuses it) and "६६५०" (int() reads 6650)
        if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
            raise ValueError(f"invalid service URL {url!r}: bad port {port_text!r}")
        port = int(port_text)
    else:
        port = DEFAULT_PORT
    shown = f"[{host}]" if ":" in host else host
    return BrokerAddress(f"pulsar://{shown}:{port}", host, port)
