"""The Ray Jobs API failing after the address answered (an HTTP 500, an answer that is not JSON): `jobs` and
`stop` print one line, not Ray client's traceback; a server error is the cluster's trouble (exit 1), an answer
that is no Jobs API's a bad address (exit 2)."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from tests.conftest import run_main


@pytest.fixture
def dashboard():
    servers = []

    def start(status: int, body: bytes) -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            def handle_one(self):
                if self.path.startswith("/api/version"):  # what Ray's client asks first: a dashboard of this Ray
                    import ray

                    code, text = 200, json.dumps({"version": "4", "ray_version": ray.__version__,
                                                  "ray_commit": "x", "session_name": "s"}).encode()
                else:
                    code, text = status, body
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            do_GET = do_POST = do_PUT = do_DELETE = handle_one

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("status, body, code, line", [
    (500, b'{"detail": "boom"}', 1, "the Ray Jobs API at http://127.0.0.1:{port} failed: Request failed with status "
                                    "code 500"),
    (200, b"<html>not json", 2, "--address: got 'http://127.0.0.1:{port}'; answers, but not as Ray's Jobs API does"),
])
def test_a_jobs_api_failing_after_its_check_is_one_line(dashboard, capsys, status, body, code, line):
    address = dashboard(status, body)
    port = address.rsplit(":", 1)[1]
    for args in (("jobs",), ("stop", "raysubmit_1")):
        got = run_main(*args, "--address", address)[0]
        err = capsys.readouterr().err.splitlines()
        assert got == code and len(err) == 1 and line.format(port=port) in err[0], err
