"""--request-timeout: a request that runs past it is aborted; a plain request gets 504 with an
OpenAI-style error, a stream gets an error event then [DONE]; its KV blocks are freed. Run
against a server started with --request-timeout 0.001. Environment: TACHYON_BASE_URL,
TACHYON_MODEL_NAME."""
import http.client
import json
import os
import unittest
import urllib.parse

from server_metrics import wait_until_idle

BASE_URL = os.environ["TACHYON_BASE_URL"]
MODEL = os.environ["TACHYON_MODEL_NAME"]
HOST, PORT = urllib.parse.urlsplit(BASE_URL).hostname, urllib.parse.urlsplit(BASE_URL).port
# 400 engine steps cannot all fit in the 1 ms timeout.
LONG = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True}


class Timeout(unittest.TestCase):
    def test_plain_request_gets_504(self):
        conn = http.client.HTTPConnection(HOST, PORT, timeout=300)
        conn.request("POST", "/v1/completions", json.dumps(LONG))
        r = conn.getresponse()
        body = json.loads(r.read())
        self.assertEqual(r.status, 504, body)
        self.assertEqual(body["error"]["code"], "request_timeout")
        self.assertEqual(body["error"]["type"], "timeout_error")

    def test_stream_gets_error_event(self):
        conn = http.client.HTTPConnection(HOST, PORT, timeout=300)
        conn.request("POST", "/v1/completions", json.dumps(dict(LONG, stream=True)))
        r = conn.getresponse()
        self.assertEqual(r.status, 200)
        events = [line[6:].strip() for line in r.read().split(b"\n") if line.startswith(b"data: ")]
        self.assertEqual(events[-1], b"[DONE]")
        self.assertEqual(json.loads(events[-2])["error"]["code"], "request_timeout")

    def test_blocks_freed(self):
        self.test_plain_request_gets_504()
        m = wait_until_idle(BASE_URL)
        self.assertEqual(m["tachyon_kv_cache_usage_ratio"], 0)
        self.assertGreaterEqual(m['tachyon_requests_finished_total{finish_reason="timeout"}'], 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
