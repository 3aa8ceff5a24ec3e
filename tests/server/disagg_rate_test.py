"""Rate matching at the router: while every decode worker is busy, new requests are held (bounded)
and refused with 503 past the bound or after the hold timeout, before any prefill runs.

Run by tests/router/disagg_server_test.cpp against a router started with --decode-max-queue 1
--max-held 1 --hold-timeout 3 and a poll interval far longer than the test, so that the request
the router sent to its one decode worker keeps counting in that worker's queue: the worker stays
busy as far as the router knows. Environment: TACHYON_ROUTER_URL, TACHYON_PREFILL_URL,
TACHYON_MODEL_NAME.
"""
import os
import threading
import time
import unittest

import openai

from server_metrics import read_metrics

ROUTER = os.environ["TACHYON_ROUTER_URL"]
PREFILL = os.environ["TACHYON_PREFILL_URL"]
MODEL = os.environ["TACHYON_MODEL_NAME"]
client = openai.OpenAI(base_url=ROUTER + "/v1", api_key="none", max_retries=0, timeout=30)
REQUEST = dict(model=MODEL, prompt="func (b *Buffer) Len() int {", max_tokens=4, temperature=0)


class RateMatching(unittest.TestCase):
    def test_hold_then_refuse(self):
        first = client.completions.create(**REQUEST)  # fills the decode queue
        self.assertTrue(first.choices[0].text)
        held = {}

        def held_request():
            t0 = time.monotonic()
            try:
                client.completions.create(**REQUEST)
                held["outcome"] = ("ok", time.monotonic() - t0)
            except openai.APIStatusError as e:
                held["outcome"] = (e.status_code, time.monotonic() - t0, e.message)

        t = threading.Thread(target=held_request)
        t.start()
        deadline = time.monotonic() + 10
        while read_metrics(ROUTER)["tachyon_router_requests_held"] != 1:
            self.assertLess(time.monotonic(), deadline, "the request was not held")
            time.sleep(0.02)
        # The held queue is full: the next one is refused at once.
        t0 = time.monotonic()
        with self.assertRaises(openai.APIStatusError) as e:
            client.completions.create(**REQUEST)
        self.assertEqual(e.exception.status_code, 503)
        self.assertIn("already waiting", e.exception.message)
        self.assertLess(time.monotonic() - t0, 2.0)  # well under the hold timeout
        t.join(10)
        self.assertFalse(t.is_alive())
        status, waited, message = held["outcome"]
        self.assertEqual(status, 503)
        self.assertIn("stayed busy", message)
        self.assertGreaterEqual(waited, 2.9)
        m = read_metrics(ROUTER)
        self.assertEqual(m["tachyon_router_requests_held"], 0)
        self.assertEqual(m["tachyon_router_requests_rejected_total"], 2)
        self.assertEqual(m['tachyon_router_requests_total{mode="disagg"}'], 1)  # no prefill ran for the others
        self.assertEqual(read_metrics(PREFILL)["tachyon_prompt_tokens_total"], first.usage.prompt_tokens)


if __name__ == "__main__":
    unittest.main()
