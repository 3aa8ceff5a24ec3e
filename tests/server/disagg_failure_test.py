"""A decode worker that dies mid-stream, behind `tachyon router`: its requests end with an error
(an error event for streams, a 5xx for plain requests) within seconds, the prefill worker holds no
KV block afterwards, requests while no decode worker is up are refused at once (503), and once the
decode worker is back (same HTTP port, a fresh process) the router serves again, with the same
output as before. Nothing may hang: every call has a timeout well under the test's.

Run by tests/router/disagg_server_test.cpp. Environment: TACHYON_ROUTER_URL, TACHYON_PREFILL_URL,
TACHYON_DECODE_URL, TACHYON_DECODE_PID (to kill), TACHYON_DECODE_CMD (a shell command that starts
the decode worker again on the same port), TACHYON_MODEL_NAME.
"""
import json
import os
import signal
import subprocess
import threading
import time
import unittest
import urllib.error
import urllib.request

import openai

from server_metrics import wait_until_idle

ROUTER = os.environ["TACHYON_ROUTER_URL"]
PREFILL = os.environ["TACHYON_PREFILL_URL"]
DECODE = os.environ["TACHYON_DECODE_URL"]
DECODE_PID = int(os.environ["TACHYON_DECODE_PID"])
DECODE_CMD = os.environ["TACHYON_DECODE_CMD"]
MODEL = os.environ["TACHYON_MODEL_NAME"]

client = openai.OpenAI(base_url=ROUTER + "/v1", api_key="none", max_retries=0, timeout=30)
LONG = dict(max_tokens=480, temperature=0, extra_body={"ignore_eos": True})
PROBE = dict(prompt="func (b *Buffer) Len() int {", max_tokens=16, temperature=0, extra_body={"ignore_eos": True})


def health(url):
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


class DecodeWorkerDies(unittest.TestCase):
    def test_kill_mid_stream_then_restart(self):
        before = client.completions.create(model=MODEL, **PROBE).choices[0].text

        # Four long streams and two plain requests through the decode worker.
        n_streams = 4
        chunks = [0] * n_streams
        outcomes = [None] * n_streams
        plain = [None] * 2
        started = threading.Event()

        def stream(i):
            try:
                for c in client.completions.create(model=MODEL, prompt=f"Once upon a time {i}", stream=True, **LONG):
                    if c.choices and c.choices[0].text:
                        chunks[i] += 1
                        if all(n >= 2 for n in chunks):
                            started.set()
                outcomes[i] = ("finished", None)
            except openai.APIError as e:
                outcomes[i] = ("error", str(e))

        def plain_request(i):
            try:
                client.completions.create(model=MODEL, prompt=f"In a land far away {i}", **LONG)
                plain[i] = ("finished", None)
            except openai.APIStatusError as e:
                plain[i] = ("status", e.status_code)
            except openai.APIError as e:
                plain[i] = ("error", str(e))

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(n_streams)]
        threads += [threading.Thread(target=plain_request, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        self.assertTrue(started.wait(30), f"the streams did not start: {chunks}")
        os.kill(DECODE_PID, signal.SIGKILL)
        killed_at = time.monotonic()
        for t in threads:
            t.join(20)
            self.assertFalse(t.is_alive(), "a request hung after the decode worker died")
        self.assertLess(time.monotonic() - killed_at, 20)
        for i, o in enumerate(outcomes):
            self.assertEqual(o[0], "error", f"stream {i} after {chunks[i]} chunks: {o}")
            self.assertIn("decode worker", o[1])
        for o in plain:
            # Each is mid-generation when the worker dies (480 tokens take far longer than the
            # streams' first two): 502 when it had been handed over, 503 when its handoff failed and
            # the retry found no decode worker. Never a hang, never a cut text passed off as done.
            self.assertEqual(o[0], "status", o)
            self.assertIn(o[1], (502, 503), o)

        # The prefill side kept nothing.
        m = wait_until_idle(PREFILL, limit_s=20)
        self.assertEqual(m["tachyon_kv_cache_blocks_used"], 0)
        self.assertEqual(m["tachyon_num_requests_running"], 0)

        # No decode worker: refused at once, not held.
        t0 = time.monotonic()
        with self.assertRaises(openai.APIStatusError) as e:
            client.completions.create(model=MODEL, **PROBE)
        self.assertEqual(e.exception.status_code, 503)
        self.assertLess(time.monotonic() - t0, 10)
        self.assertEqual(health(ROUTER), 503)

        # The decode worker comes back on the same port: service resumes, same output.
        restarted = subprocess.Popen(DECODE_CMD, shell=True)
        try:
            deadline = time.monotonic() + 60
            while health(ROUTER) != 200:
                self.assertIsNone(restarted.poll(), "the restarted decode worker exited")
                self.assertLess(time.monotonic(), deadline, "the router did not see the decode worker again")
                time.sleep(0.05)
            again = client.completions.create(model=MODEL, **PROBE).choices[0].text
            self.assertEqual(again, before)
            streamed = "".join(c.choices[0].text for c in client.completions.create(model=MODEL, stream=True, **PROBE)
                               if c.choices)
            self.assertEqual(streamed, before)
            with urllib.request.urlopen(ROUTER + "/metrics", timeout=5) as r:
                text = r.read().decode()
            failed = [l for l in text.splitlines() if l.startswith("tachyon_router_requests_failed_total ")]
            self.assertGreaterEqual(float(failed[0].split()[1]), 6, text)
        finally:
            restarted.send_signal(signal.SIGTERM)
            try:
                restarted.wait(20)
            except subprocess.TimeoutExpired:
                restarted.kill()
                restarted.wait()


if __name__ == "__main__":
    unittest.main()
