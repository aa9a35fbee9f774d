"""Rendezvous ports: free on this host, drawn between Ray's worker ports and the kernel's
ephemeral range. Torch-free (standard library only): the tiny Ray tasks that look where a
placement-group bundle landed import it, and a worker that imported torch for one port would
spend about 1.5 s of CPU on it (docs/benchmarks-log.md, "Start-up CPU: helper processes without
torch, megatron-core without dynamo").
"""

from __future__ import annotations

# Ports for rendezvous are drawn from here, above Ray's worker ports (10002-19999 by default)
# and below the kernel's ephemeral range, where port-0 binds and outgoing connections (Ray's
# gRPC, the other jobs of the node) take theirs: a port picked there and bound a moment later
# was taken in between under load (EADDRINUSE in rank 0's TCPStore, two test suites at once).
PORT_RANGE_LOW = 20000


def ephemeral_port_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple:
    """The kernel's (first, last) ephemeral port; Linux's default where it cannot be read."""
    try:
        with open(path) as f:
            lo, hi = (int(x) for x in f.read().split()[:2])
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_port(rng=None) -> int:
    """A TCP port that is free on this host right now (for a rendezvous or a test server):
    a random one in [PORT_RANGE_LOW, first ephemeral port), checked by binding it; a port the
    kernel assigns (bind to 0) where that range is too small or full."""
    import random
    import socket

    rng = rng or random.SystemRandom()
    hi = ephemeral_port_range()[0]
    if hi - PORT_RANGE_LOW >= 1000:
        for _ in range(64):
            port = rng.randrange(PORT_RANGE_LOW, hi)
            with socket.socket() as s:
                try:
                    s.bind(("", port))
                except OSError:
                    continue
            return port
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
