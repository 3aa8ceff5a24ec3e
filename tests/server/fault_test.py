"""A step that fails inside the engine (an op's workspace or a kernel launch, failed once on purpose
with TACHYON_INJECT_FAULT when the server started): the request it ran gets a 500 with an
OpenAI-style error that says what failed, the requests after it complete, /metrics counts the
failed step, and no KV block stays held. Run against a server started with TACHYON_INJECT_FAULT
set to fail its first forward (workspace:1 or kernel:1). Environment: TACHYON_BASE_URL,
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
REQUEST = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "ignore_eos": True, "temperature": 0}


def post(body):
    conn = http.client.HTTPConnection(HOST, PORT, timeout=300)
    conn.request("POST", "/v1/completions", json.dumps(body))
    r = conn.getresponse()
    return r.status, r.read()


class Fault(unittest.TestCase):
    def test_the_failed_request_gets_an_error_and_the_server_goes_on(self):
        status, body = post(REQUEST)
        self.assertEqual(status, 500, body)
        error = json.loads(body)["error"]
        self.assertIn("injected fault", error["message"])
        self.assertEqual(error["type"], "server_error")

        # The same request again, a stream and a chat: all served in full.
        status, body = post(REQUEST)
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body)["usage"]["completion_tokens"], 8)
        status, body = post(dict(REQUEST, stream=True))
        self.assertEqual(status, 200, body)
        events = [line[6:].strip() for line in body.split(b"\n") if line.startswith(b"data: ")]
        self.assertEqual(events[-1], b"[DONE]")
        self.assertFalse(any(b'"error"' in e for e in events), events)
        conn = http.client.HTTPConnection(HOST, PORT, timeout=300)
        conn.request("POST", "/v1/chat/completions", json.dumps(
            {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}))
        r = conn.getresponse()
        self.assertEqual(r.status, 200, r.read())

        m = wait_until_idle(BASE_URL)
        self.assertEqual(m["tachyon_failed_steps_total"], 1)
        self.assertEqual(m['tachyon_requests_finished_total{finish_reason="error"}'], 1)
        self.assertEqual(m["tachyon_kv_cache_blocks_used"], 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
