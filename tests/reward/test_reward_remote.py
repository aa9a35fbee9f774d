"""Remote reward model over HTTP, against a real local server started by the test.

The server (http.server in a thread, shut down in a finally) scores a record +1 when its
response equals ``metadata["want"]``; other paths answer 503 a few times, stall, send a
wrong number of rewards or refuse with 400.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from megatron_dapo.reward import BatchScorer, RemoteRewardError, RemoteRewardModel, RewardInput


class _Server:
    def __init__(self):
        self.batches: list[tuple[str, list]] = []  # (path, records) of every request
        self.failures_left = {"/flaky": 2}
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                records = body["records"]
                server.batches.append((self.path, records))
                if self.path == "/stall":
                    server.release.wait(30)
                    return self._send(200, {"rewards": [0.0] * len(records)})
                if server.failures_left.get(self.path, 0) > 0:
                    server.failures_left[self.path] -= 1
                    return self._send(503, {"error": "warming up"})
                if self.path == "/short":
                    return self._send(200, {"rewards": [1.0]})
                if self.path == "/refuse":
                    return self._send(400, {"error": "bad schema"})
                rewards = [
                    {"score": 1.0 if r["response"] == r["metadata"].get("want") else -1.0, "pred": r["data_source"]}
                    for r in records
                ]
                self._send(200, {"rewards": rewards})

            def _send(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=30)


@pytest.fixture()
def server():
    srv = _Server()
    try:
        yield srv
    finally:
        srv.close()


def _records(n, source="rm"):
    return [RewardInput(f"r{i}", "", f"prompt {i}", source, {"want": "r0" if i % 2 == 0 else "x"}) for i in range(n)]


def test_batches_carry_the_whole_record(server):
    model = RemoteRewardModel(server.url + "/score", batch_size=3, max_concurrency=2)
    results = model.score(_records(7))
    assert [r.acc for r in results] == [True] + [False] * 6  # only record 0 says "r0" and wants "r0"
    assert [r.pred for r in results] == ["rm"] * 7
    assert sorted(len(b) for _, b in server.batches) == [1, 3, 3]
    sent = sorted((r for _, b in server.batches for r in b), key=lambda r: r["response"])
    assert sent[1] == {
        "prompt": "prompt 1",
        "response": "r1",
        "label": "",
        "data_source": "rm",
        "metadata": {"want": "x"},
    }
    assert model.requests == 3 and model.retries == 0


def test_retries_a_server_that_is_warming_up(server):
    model = RemoteRewardModel(server.url + "/flaky", max_retries=3, backoff_s=0.01)
    assert [r.acc for r in model.score(_records(2))] == [True, False]
    assert model.requests == 3 and model.retries == 2


def test_gives_up_naming_the_endpoint(server):
    model = RemoteRewardModel(server.url + "/flaky", max_retries=1, backoff_s=0.01)
    with pytest.raises(RemoteRewardError, match=rf"{server.url}/flaky.*2 attempt\(s\): HTTP 503"):
        model.score(_records(1))


def test_timeout_is_retried_then_named(server):
    model = RemoteRewardModel(server.url + "/stall", timeout_s=0.5, max_retries=1, backoff_s=0.01)
    with pytest.raises(RemoteRewardError, match=rf"{server.url}/stall.*no answer within 0.5 s"):
        model.score(_records(1))
    assert model.requests == 2


@pytest.mark.parametrize(
    "path,message", [("/short", "expected .* with 2 entries, got 1 rewards"), ("/refuse", "1 attempt\\(s\\): HTTP 400")]
)
def test_bad_answers_are_not_retried(server, path, message):
    model = RemoteRewardModel(server.url + path, max_retries=3, backoff_s=0.01)
    with pytest.raises(RemoteRewardError, match=message):
        model.score(_records(2))
    assert model.requests == 1


def test_unreachable_endpoint():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = RemoteRewardModel(f"http://127.0.0.1:{port}/score", max_retries=1, backoff_s=0.01)
    with pytest.raises(RemoteRewardError, match=rf"127.0.0.1:{port}/score.*2 attempt"):
        model.score(_records(1))


@pytest.mark.parametrize("url", ["ftp://host/x", "http:///x", "localhost:8000", 5])
def test_bad_urls(url):
    with pytest.raises(ValueError, match="URL"):
        RemoteRewardModel(url)


def test_scorer_routes_by_data_source(server):
    """One batch mixing sources: "rm" goes to the HTTP model (no label needed), the rest to
    the built-in dapo checker in the worker process; results keep the input order."""
    items = [
        RewardInput("Answer: 5", "5", "p", "gsm8k"),
        *_records(3),
        ("Answer: 4", "5"),  # a plain pair: data source "", the default checker
    ]
    with BatchScorer(
        num_workers=1, timeout_s=30, sources={"rm": server.url + "/score"}, remote_batch_size=2, remote_max_retries=1
    ) as pool:
        results = pool.score(items)
        assert [(r.acc, r.pred) for r in results] == [
            (True, "5"),
            (True, "rm"),
            (False, "rm"),
            (False, "rm"),
            (False, "4"),
        ]
        assert sorted(len(b) for _, b in server.batches) == [1, 2]  # only the "rm" records went out
        with pytest.raises(ValueError, match=r"item 0 \(data_source 'gsm8k'\): ground_truth is empty"):
            pool.score([RewardInput("Answer: 5", "", "p", "gsm8k")])
        # a remote failure stops the call loudly, and the pool still works afterwards
        server.failures_left["/score"] = 100
        with pytest.raises(RemoteRewardError, match=rf"{server.url}/score"):
            pool.score(_records(1))
        assert pool.score([("Answer: 5", "5")])[0].acc
