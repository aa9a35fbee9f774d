"""free_port: rendezvous ports come from below the kernel's ephemeral range (where port-0 binds
and outgoing connections take theirs) and above Ray's worker ports, and are free when returned."""

from __future__ import annotations

import random
import socket
import subprocess
import sys

from megatron_dapo import distributed
from megatron_dapo import ports as d


def test_ports_come_from_below_the_ephemeral_range_and_are_free():
    lo, _ = d.ephemeral_port_range()
    ports = {d.free_port() for _ in range(50)}
    for port in ports:
        assert d.PORT_RANGE_LOW <= port < lo, port
        with socket.socket() as s:
            s.bind(("", port))  # free (nothing else on the machine took it since)
    assert len(ports) > 40  # drawn at random, not one fixed port every caller would share


def test_a_taken_port_is_skipped():
    held = socket.socket()
    try:
        taken = d.free_port()
        held.bind(("", taken))
        held.listen()
        draws = []

        class TakenFirst(random.Random):
            def randrange(self, a, b):
                draws.append(taken if not draws else random.randrange(a, b))
                return draws[-1]

        port = d.free_port(TakenFirst())
        assert draws[0] == taken and len(draws) >= 2 and port == draws[-1] != taken
    finally:
        held.close()


def test_kernel_port_where_the_range_below_the_ephemeral_ports_is_too_small(monkeypatch, tmp_path):
    f = tmp_path / "range"
    f.write_text("20500\t60999\n")  # only 500 ports between 20000 and the ephemeral range
    real = d.ephemeral_port_range
    monkeypatch.setattr(d, "ephemeral_port_range", lambda: real(str(f)))
    assert d.ephemeral_port_range() == (20500, 60999)
    port = d.free_port()
    assert not (d.PORT_RANGE_LOW <= port < 20500)  # the kernel's choice, from its own range
    assert real(str(tmp_path / "missing")) == (32768, 60999)


def test_the_port_helpers_import_no_torch():
    """The bundle probes (launch.placement._where) run in fresh Ray workers: torch there costs
    each one about 1.5 s of CPU for nothing."""
    code = "import sys, megatron_dapo.ports, megatron_dapo.launch.placement; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
    assert distributed.free_port is d.free_port  # the old name still works
