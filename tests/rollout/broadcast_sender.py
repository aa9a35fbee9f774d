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


if __name__ == "__main__":
    sys.exit(main())
