"""`tachyon serve --api-key KEY` (or TACHYON_API_KEY): /v1/* without "Authorization: Bearer KEY"
gets 401 with an OpenAI-style error body; with it, everything works, streamed or not; /health and
/metrics stay open.

Run by tests/server/server_test.cpp against a server started with the key. Environment:
TACHYON_BASE_URL, TACHYON_MODEL_NAME, TACHYON_TEST_API_KEY (the key the server expects).
"""
import http.client
import json
import os
import unittest
import urllib.parse

import openai

BASE_URL = os.environ["TACHYON_BASE_URL"]
MODEL = os.environ["TACHYON_MODEL_NAME"]
KEY = os.environ["TACHYON_TEST_API_KEY"]
HOST, PORT = urllib.parse.urlsplit(BASE_URL).hostname, urllib.parse.urlsplit(BASE_URL).port


def request(method, path, body=None, headers=None):
    conn = http.client.HTTPConnection(HOST, PORT, timeout=120)
    conn.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                 headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    raw = r.read()
    conn.close()
    try:
        return r.status, json.loads(raw)
    except ValueError:
        return r.status, raw.decode(errors="replace")


class ApiKey(unittest.TestCase):
    def test_wrong_or_missing_key_is_401(self):
        wrong = openai.OpenAI(base_url=BASE_URL + "/v1", api_key="sk-wrong", max_retries=0, timeout=60)
        with self.assertRaises(openai.AuthenticationError) as ctx:
            wrong.completions.create(model=MODEL, prompt="hi", max_tokens=2)
        self.assertEqual(ctx.exception.status_code, 401)
        self.assertEqual(ctx.exception.code, "invalid_api_key")
        with self.assertRaises(openai.AuthenticationError):
            wrong.models.list()
        for path, body in (("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                           ("/v1/models", None)):
            status, err = request("POST" if body else "GET", path, body)
            self.assertEqual(status, 401, err)
            self.assertEqual(set(err["error"]), {"message", "type", "param", "code"}, err)
            self.assertEqual(err["error"]["code"], "invalid_api_key")
        status, _ = request("POST", "/v1/completions", {"prompt": "hi"}, {"Authorization": KEY})  # no scheme
        self.assertEqual(status, 401)

    def test_right_key_works(self):
        client = openai.OpenAI(base_url=BASE_URL + "/v1", api_key=KEY, max_retries=0, timeout=300)
        r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4, temperature=0)
        self.assertEqual(len(r.choices), 1)
        text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0, stream=True)
            if c.choices)
        self.assertIsInstance(text, str)
        self.assertEqual(client.models.list().data[0].id, MODEL)

    def test_health_and_metrics_stay_open(self):
        status, body = request("GET", "/health")
        self.assertEqual(status, 200, body)
        status, body = request("GET", "/metrics")
        self.assertEqual(status, 200)
        self.assertIn("tachyon_", body)


if __name__ == "__main__":
    unittest.main(verbosity=2)
