"""CLI: ``tributary serve`` runs the HTTP API (commands in, view queries out) under uvicorn.

The port is bound before uvicorn starts, so a busy port is reported plainly (naming the
option that chooses it) instead of as a server traceback. SIGTERM and Ctrl-C stop it
gracefully: requests in flight finish (at most ``GRACE_S`` seconds), then it exits 0.
"""

import errno
import ipaddress
import signal
import socket
from typing import Annotated

import typer

from infra.cli_app import app, console, fail, settings
from tributary.errors import TributaryError

GRACE_S = 15


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready socket on ``host:port``; fails with what to do when it cannot."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        fail(f"--host {host}: cannot resolve it ({exc.strerror})")
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: without it, uvicorn's answer on a kept-alive
    # connection waited for the client's delayed ACK (40 ms a request).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            fail(
                f"port {port} on {host} is in use: stop what holds it, or choose another port"
                " with --port (or TRIBUTARY_API_PORT)"
            )
        fail(f"cannot listen on {host}:{port} ({exc.strerror}): choose another --host or --port")
    return sock


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@app.command()
def serve(
    host: Annotated[
        str | None, typer.Option(help="Address to listen on [default: TRIBUTARY_API_HOST].")
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, help="Port to listen on [default: TRIBUTARY_API_PORT]."),
    ] = None,
) -> None:
    """Serve the HTTP API: POST /commands, a GET route per view query, /health, /docs."""
    import uvicorn

    from infra.http_api import create_app

    s = settings()
    host = s.api_host if host is None else host
    port = s.api_port if port is None else port
    try:
        api = create_app(s)
    except TributaryError as exc:
        fail(exc)
    sock = bind(host, port)
    # uvicorn handles SIGTERM/SIGINT while it serves, then raises the signal again once it has
    # stopped: these no-op handlers receive it, so the process exits 0 after a graceful stop.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server = uvicorn.Server(
        uvicorn.Config(api, timeout_graceful_shutdown=GRACE_S, log_level="info")
    )
    bound_port = sock.getsockname()[1]
    console.print(f"serving http://{host}:{bound_port} (OpenAPI at /docs); Ctrl-C stops")
    if s.api_token is None and not is_loopback(host):
        console.print(
            f"warning: anyone who reaches {host}:{bound_port} can send commands: set"
            " TRIBUTARY_API_TOKEN (and TRIBUTARY_API_READ_TOKEN for the reads)",
            soft_wrap=True,
        )
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    console.print("stopped")
