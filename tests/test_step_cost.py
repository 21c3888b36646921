"""`kvscope calibrate`'s fit, known by hand, and its errors; the probes against a real vLLM
server run in tests/test_scheduler_replay.py (the timed-arrival test takes their fit)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from collector.cli import main
from collector.live.step_cost import Measurements, fit_step_model
from collector.model.step_model import StepModel
from tests.support.ports import free_port


def test_the_fit_recovers_a_known_step_cost() -> None:
    # A step of k decodes takes 3 ms + 90 us per token; a prompt of L tokens answers after a
    # 5 ms round trip, plus ceil(L / 256) steps of 3 ms, plus 15 us per token.
    decode = {k: 0.003 + k * 90e-6 for k in (1, 4, 8)}
    prefill = {n: 0.005 + -(-n // 256) * 0.003 + n * 15e-6 for n in (16, 64, 250, 600, 1000)}
    fitted = fit_step_model(Measurements(prefill, decode), max_num_batched_tokens=256)
    assert fitted == StepModel(step_ms=3.0, prefill_us_per_token=15.0, decode_us_per_token=90.0)


def test_noise_below_zero_becomes_zero() -> None:
    # Decode steps that shrink as the batch grows (noise): no negative cost per token.
    decode = {1: 0.004, 8: 0.0035}
    prefill = {16: 0.010, 250: 0.009}
    fitted = fit_step_model(Measurements(prefill, decode), max_num_batched_tokens=256)
    assert fitted.decode_us_per_token == 0.0 and fitted.prefill_us_per_token == 0.0
    assert fitted.step_ms > 0


def test_one_point_is_not_a_fit() -> None:
    with pytest.raises(ValueError, match="at least two"):
        fit_step_model(Measurements({16: 0.01}, {1: 0.003, 4: 0.004}), 256)


def test_no_server_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["calibrate", "--url", url]) == 2
    assert f"kvscope: error: {url}/v1/models: " in capsys.readouterr().err


@contextmanager
def answering(body: bytes) -> Iterator[str]:
    """A local HTTP server that answers every GET and POST with `body`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"<html>not vLLM</html>", "the answer is not JSON"),
        (b'{"data": []}', "lists no model"),
        (b"[1, 2]", "the answer is not a JSON object"),
    ],
)
def test_a_server_that_is_not_vllm_is_a_clear_error(
    body: bytes, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with answering(body) as url:
        assert main(["calibrate", "--url", url]) == 2
    assert reason in capsys.readouterr().err


def test_a_server_that_returns_too_few_tokens_is_a_clear_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with answering(b'{"data": [{"id": "m"}], "usage": {"completion_tokens": 0}}') as url:
        assert main(["calibrate", "--url", url, "--repeats", "1"]) == 2
    assert "did not return 2 tokens" in capsys.readouterr().err
