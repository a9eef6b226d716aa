"""An engine that takes its time to start, for the conformance suite's start-up watch
(`tests/conformance/procs.py`): `python starting_engine.py PORT MODE N`.

It listens on 127.0.0.1:PORT at once (printing `listening`) and answers `GET /health`, so the
test drives its start-up by polling; each mode is deterministic in the number of polls:

- `slow`: 503 and one log line per poll for the first N polls (it is loading: progress), then 200.
- `dies`: after N polls of progress, prints a fatal error, stops listening, and exits with status 3
  a second later (as vLLM tears its workers down after a fatal error; on a loaded machine any
  exit takes a while): polls in that second are refused.
- `stalls`: after N polls of progress, prints `loading weights`, stops listening and sleeps: no log,
  no CPU time, no answer (a hung start-up).
"""

from __future__ import annotations

import http.server
import os
import sys
import threading
import time


def main() -> None:
    port, mode, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    polls = 0
    stalled = threading.Event()
    dying = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            nonlocal polls
            polls += 1
            if polls > n and mode == "slow":
                self._answer(200)
                return
            if polls > n and mode == "dies":
                if not dying.is_set():
                    print("fatal: cannot allocate the KV cache", flush=True)
                    dying.set()
                    stalled.set()  # stop listening
                self._answer(503)
                return
            if polls > n and mode == "stalls":
                if not stalled.is_set():  # a poll may come in while it stops listening: once
                    print("loading weights", flush=True)
                    stalled.set()
                self._answer(503)
                return
            print(f"loading: step {polls}", flush=True)
            self._answer(503)

        def _answer(self, status: int) -> None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print("listening", flush=True)
    stalled.wait()
    server.shutdown()
    server.server_close()
    if dying.is_set():
        time.sleep(1.0)  # tearing down
        os._exit(3)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
