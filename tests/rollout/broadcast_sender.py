"""The trainer's sync rank of a weight broadcast, in a process of its own (SGLang is imported
here, not in the test's process): ``python -m tests.rollout.broadcast_sender ADDRESS PORT WORLD
GROUP`` opens the sender's member of the group (hybrid/weight_broadcast.py), says "joined", then
for each line on stdin (the path of a ``torch.save``'d bucket: a list of (name, tensor)) broadcasts
it and says "sent BYTES"; an empty line ends it."""

from __future__ import annotations

import sys


def main() -> int:
    import torch

    from megatron_dapo.hybrid.weight_broadcast import broadcast_bucket, open_weight_update_group

    address, port, world, group_name = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    group = open_weight_update_group(address, port, world, group_name, backend="gloo")
    print("joined", flush=True)
    for line in sys.stdin:
        path = line.strip()
        if not path:
            break
        print(f"sent {broadcast_bucket(group, torch.load(path))}", flush=True)
    return 0


class Sender:
    """The sender process, for a test: ``with Sender(port, world, group) as send:`` starts it (it
    joins as the test's engine joins), ``send(path)`` broadcasts one bucket file and returns once
    it was sent; the process is ended on the way out, also on a failure."""

    def __init__(self, port: int, world: int, group_name: str):
        self.args = ["127.0.0.1", str(port), str(world), group_name]

    def __enter__(self):
        import subprocess

        from megatron_dapo.rollout.engine_host import ROOT

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.rollout.broadcast_sender", *self.args],
            cwd=str(ROOT),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        return self

    def joined(self) -> None:
        assert self.proc.stdout.readline().strip() == "joined"

    def send(self, path) -> None:
        """Write ``path`` to the sender (it broadcasts); call :meth:`sent` for its answer."""
        self.proc.stdin.write(f"{path}\n")
        self.proc.stdin.flush()

    def sent(self) -> None:
        assert self.proc.stdout.readline().startswith("sent ")

    def __exit__(self, *exc):
        import subprocess

        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        return False


if __name__ == "__main__":
    sys.exit(main())
