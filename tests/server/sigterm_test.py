"""SIGTERM drains: streams in flight run to their end (finish_reason and [DONE]), the listening
socket closes, and the process exits 0 (checked by the caller). Environment: TACHYON_BASE_URL,
TACHYON_MODEL_NAME, TACHYON_SERVER_PID."""
import json
import os
import signal
import socket
import threading
import time
import unittest
import urllib.parse

BASE_URL = os.environ["TACHYON_BASE_URL"]
MODEL = os.environ["TACHYON_MODEL_NAME"]
PID = int(os.environ["TACHYON_SERVER_PID"])
HOST, PORT = urllib.parse.urlsplit(BASE_URL).hostname, urllib.parse.urlsplit(BASE_URL).port
STREAMS = 8
MAX_TOKENS = 48


class Stream(threading.Thread):
    """One streaming completion over a raw socket; signals `started` at its first token."""

    def __init__(self, i):
        super().__init__(daemon=True)
        self.i, self.started, self.events, self.error = i, threading.Event(), [], None

    def run(self):
        try:
            body = json.dumps({"model": MODEL, "prompt": f"Once upon a time {self.i}", "max_tokens": MAX_TOKENS,
                               "stream": True, "ignore_eos": True, "logprobs": 0}).encode()
            with socket.create_connection((HOST, PORT), timeout=300) as s:
                s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n")
                          .encode() + body)
                f = s.makefile("rb")
                assert f.readline().startswith(b"HTTP/1.1 200")
                while True:
                    line = f.readline()
                    if not line:
                        break
                    if line.startswith(b"data: "):
                        self.events.append(line[6:].strip())
                        self.started.set()
                        if line.startswith(b"data: [DONE]"):
                            break
        except Exception as e:  # reported by the test
            self.error = e
        finally:
            self.started.set()


class Drain(unittest.TestCase):
    def test_sigterm_finishes_streams_then_exits(self):
        streams = [Stream(i) for i in range(STREAMS)]
        for s in streams:
            s.start()
        for s in streams:
            self.assertTrue(s.started.wait(300))
        os.kill(PID, signal.SIGTERM)
        # New connections are refused once the listening socket is closed.
        deadline = time.monotonic() + 120
        refused = False
        while time.monotonic() < deadline and not refused:
            try:
                socket.create_connection((HOST, PORT), timeout=5).close()
                time.sleep(0.02)
            except OSError:
                refused = True
        self.assertTrue(refused)
        for s in streams:
            s.join(300)
            self.assertIsNone(s.error)
            self.assertEqual(s.events[-1], b"[DONE]", s.events[-3:])
            chunks = [json.loads(e) for e in s.events[:-1]]
            self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], "length")
            tokens = sum(len(c["choices"][0]["logprobs"]["tokens"]) for c in chunks if c["choices"][0]["logprobs"])
            self.assertEqual(tokens, MAX_TOKENS)


if __name__ == "__main__":
    unittest.main(verbosity=2)
