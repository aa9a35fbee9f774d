"""An HFEngine in its own OS process, reached over a local socket (tests of the payload path).

The trainer side (a gloo rank of tests/harness.py, itself a daemon process that may not fork
multiprocessing children) starts ``python -m tests.hybrid.engine_proc CFG_JSON`` with
``subprocess``; the child listens on a local port, prints it, and serves requests in order:
("load", payloads), ("finish",), ("score", seqs, prompt_lens), ("weights",), ("stop",).
Only what the socket carries crosses the process boundary: the test counts it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from multiprocessing.connection import Client, Listener
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_KEY = b"megatron-dapo-test-engine"


class EngineProcess:
    """Client of one engine process; ``calls()`` gives its ``EngineCalls``."""

    def __init__(self, hf_cfg: dict, seed: int = 99):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.hybrid.engine_proc", json.dumps(hf_cfg), str(seed)],
            cwd=str(ROOT),
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            line = self.proc.stdout.readline()
            if not line.strip().isdigit():
                raise RuntimeError(f"engine process did not start (said {line!r}, exit {self.proc.poll()})")
            self.conn = Client(("127.0.0.1", int(line)), authkey=_KEY)
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            raise
        self.bytes_sent = 0  # what crossed the process boundary towards the engine
        self.loads = 0

    def _ask(self, *msg):
        self.conn.send(msg)
        return self._reply()

    def _reply(self):
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"engine process: {value}")
        return value

    # EngineCalls
    def send(self, payloads):
        self.bytes_sent += sum(len(p) for p in payloads)
        self.loads += 1
        self.conn.send(("load", list(payloads)))
        return self.loads

    def resolve(self, _token):
        return self._reply()  # replies come in request order

    def finish(self):
        return self._ask("finish")

    def calls(self):
        from megatron_dapo.hybrid.weight_sync import EngineCalls

        return EngineCalls(self.send, self.resolve, self.finish)

    # what the probe and the checks need
    def score(self, sequences, prompt_lens):
        return self._ask("score", sequences, list(prompt_lens))

    def weights(self) -> dict:
        import io

        import torch

        return torch.load(io.BytesIO(self._ask("weights")))

    def close(self):
        try:
            self.conn.send(("stop",))
            self.proc.wait(timeout=20)
        except Exception:
            pass
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.conn.close()
            self.proc.stdout.close()


def _serve(hf_cfg: dict, seed: int) -> None:
    import io

    import torch

    torch.set_num_threads(1)
    from megatron_dapo.rollout.hf_engine import HFEngine
    from tests.hybrid.bodies import hf_config_obj

    torch.manual_seed(seed)
    engine = HFEngine(hf_config_obj(hf_cfg))
    with Listener(("127.0.0.1", 0), authkey=_KEY) as listener:
        print(listener.address[1], flush=True)
        with listener.accept() as conn:
            while True:
                msg = conn.recv()
                if msg[0] == "stop":
                    return
                try:
                    if msg[0] == "load":
                        out = engine.update_weights_from_payloads(msg[1])
                    elif msg[0] == "finish":
                        out = engine.finish_weight_update()
                    elif msg[0] == "score":
                        out = engine.score(msg[1], msg[2])
                    elif msg[0] == "weights":
                        buf = io.BytesIO()  # bytes: a Connection would pickle tensors as fds
                        torch.save({n: engine.get_weight(n).clone() for n in engine.expected_weight_names()}, buf)
                        out = buf.getvalue()
                    else:
                        raise ValueError(f"unknown request {msg[0]!r}")
                    conn.send(("ok", out))
                except Exception as exc:  # noqa: BLE001 - reported to the trainer side
                    conn.send(("error", f"{type(exc).__name__}: {exc}"))


if __name__ == "__main__":
    _serve(json.loads(sys.argv[1]), int(sys.argv[2]))
