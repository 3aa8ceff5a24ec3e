"""Every bad input gets its HTTP status and an OpenAI-style error body, never a crash: invalid
JSON, wrong types, unknown model, prompt over the context, max_tokens out of range, invalid UTF-8,
oversized bodies, unknown routes; a full waiting queue answers 503. The server stays up
throughout. Run against a server started with --max-body 1MiB --max-seqs 1 --max-waiting 2.
Environment: TACHYON_BASE_URL, TACHYON_MODEL_NAME."""
import http.client
import json
import os
import socket
import unittest
import urllib.parse

from server_metrics import wait_until_idle

BASE_URL = os.environ["TACHYON_BASE_URL"]
MODEL = os.environ["TACHYON_MODEL_NAME"]
HOST, PORT = urllib.parse.urlsplit(BASE_URL).hostname, urllib.parse.urlsplit(BASE_URL).port
CONTEXT = 512  # the bundled model's
MAX_BODY = 1 << 20


def request(method, path, body=None, headers=None, conn=None):
    """(status, parsed JSON or raw text) of one request."""
    own = conn is None
    conn = conn or http.client.HTTPConnection(HOST, PORT, timeout=120)
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    data = r.read()
    if own:
        conn.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, data.decode(errors="replace")


class BadInputs(unittest.TestCase):
    def assert_error(self, status, body, expected_status, param=None, code=None):
        self.assertEqual(status, expected_status, body)
        self.assertIsInstance(body, dict, body)
        err = body["error"]
        self.assertEqual(set(err), {"message", "type", "param", "code"}, err)
        self.assertIsInstance(err["message"], str)
        self.assertTrue(err["message"])
        if param is not None:
            self.assertEqual(err["param"], param, err)
        if code is not None:
            self.assertEqual(err["code"], code, err)

    def completion(self, **fields):
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
        body.update(fields)
        return request("POST", "/v1/completions", body)

    def chat(self, **fields):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        body.update(fields)
        return request("POST", "/v1/chat/completions", body)

    def test_invalid_json(self):
        for raw in ('{"prompt": "x",', "not json", "", '{"prompt": "x"} trailing'):
            self.assert_error(*request("POST", "/v1/completions", raw), 400)
        self.assert_error(*request("POST", "/v1/chat/completions", "[1, 2]"), 400)

    def test_deeply_nested_json(self):
        self.assert_error(*request("POST", "/v1/completions", "[" * 500000 + "]" * 500000), 400)
        nested = '{"messages": [{"role": "user", "content": "x", "tool_calls": ' + "[" * 1000 + "]" * 1000 + "}]}"
        self.assert_error(*request("POST", "/v1/chat/completions", nested), 400)
        # Brackets inside strings are text, not nesting.
        status, body = self.completion(prompt="[" * 300, max_tokens=1)
        self.assertEqual(status, 200, body)

    def test_wrong_types(self):
        self.assert_error(*self.completion(max_tokens="ten"), 400, param="max_tokens")
        self.assert_error(*self.completion(max_tokens=2.5), 400, param="max_tokens")
        self.assert_error(*self.completion(temperature="hot"), 400, param="temperature")
        self.assert_error(*self.completion(n="2"), 400, param="n")
        self.assert_error(*self.completion(stop=5), 400, param="stop")
        self.assert_error(*self.completion(stream="yes"), 400, param="stream")
        self.assert_error(*self.completion(prompt=None), 400, param="prompt")
        self.assert_error(*self.completion(prompt={"text": "x"}), 400, param="prompt")
        self.assert_error(*self.completion(prompt=[1, "x"]), 400, param="prompt")
        self.assert_error(*self.completion(prompt=[]), 400, param="prompt")
        self.assert_error(*self.completion(logit_bias=[1]), 400, param="logit_bias")
        self.assert_error(*self.chat(messages="hi"), 400, param="messages")
        self.assert_error(*self.chat(messages=[]), 400, param="messages")
        self.assert_error(*self.chat(messages=[{"content": "no role"}]), 400, param="messages")
        self.assert_error(*self.chat(messages=[{"role": "user", "content": 7}]), 400, param="messages")
        self.assert_error(*self.chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), 400)
        self.assert_error(*self.chat(logprobs="yes"), 400, param="logprobs")

    def test_out_of_range_values(self):
        self.assert_error(*self.completion(temperature=-1), 400, param="temperature")
        self.assert_error(*self.completion(top_p=0), 400, param="top_p")
        self.assert_error(*self.completion(n=0), 400, param="n")
        self.assert_error(*self.completion(n=100000), 400, param="n")
        self.assert_error(*self.completion(logprobs=21), 400, param="logprobs")
        self.assert_error(*self.completion(presence_penalty=3), 400, param="presence_penalty")
        self.assert_error(*self.completion(prompt=[1, 99999]), 400, param="prompt")
        self.assert_error(*self.completion(prompt=[-1]), 400, param="prompt")
        self.assert_error(*self.completion(echo=True, logprobs=1), 400, param="echo")
        self.assert_error(*self.chat(top_logprobs=3), 400, param="top_logprobs")

    def test_unknown_model(self):
        status, body = self.completion(model="gpt-4")
        self.assert_error(status, body, 404, param="model", code="model_not_found")
        status, body = self.chat(model="no-such-model")
        self.assert_error(status, body, 404, param="model", code="model_not_found")
        self.assert_error(*request("GET", "/v1/models/no-such-model"), 404)

    def test_prompt_over_the_context(self):
        status, body = self.completion(prompt=[5] * (CONTEXT + 10))
        self.assert_error(status, body, 400, param="prompt", code="context_length_exceeded")
        self.assert_error(*self.completion(prompt=[5] * CONTEXT), 400, code="context_length_exceeded")
        self.assert_error(*self.completion(prompt="word " * 2000), 400, code="context_length_exceeded")
        status, body = self.chat(messages=[{"role": "user", "content": "word " * 2000}])
        self.assert_error(status, body, 400, param="messages", code="context_length_exceeded")

    def test_max_tokens_out_of_range(self):
        for value in (0, -1):
            self.assert_error(*self.completion(max_tokens=value), 400, param="max_tokens")
            self.assert_error(*self.chat(max_tokens=value), 400, param="max_tokens")
        self.assert_error(*self.chat(max_completion_tokens=0), 400, param="max_completion_tokens")
        self.assert_error(*self.completion(max_tokens=CONTEXT + 1), 400, param="max_tokens",
                          code="context_length_exceeded")
        self.assert_error(*self.completion(max_tokens=10 ** 12), 400, param="max_tokens")

    def test_invalid_utf8(self):
        raw = b'{"model": "' + MODEL.encode() + b'", "prompt": "caf\xe9 \xff\xfe", "max_tokens": 2}'
        self.assert_error(*request("POST", "/v1/completions", raw), 400)
        raw = b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}'
        self.assert_error(*request("POST", "/v1/chat/completions", raw), 400)

    def test_oversized_bodies(self):
        big = json.dumps({"model": MODEL, "prompt": "x" * (MAX_BODY + 1000)})
        self.assert_error(*request("POST", "/v1/completions", big), 413)
        # Refused on the declared length alone, before the body is read.
        with socket.create_connection((HOST, PORT), timeout=60) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000000000\r\n\r\n{")
            reply = b""
            while b"\r\n\r\n" not in reply:
                data = s.recv(65536)
                if not data:
                    break
                reply += data
            self.assertTrue(reply.startswith(b"HTTP/1.1 413 "), reply[:100])
        # A body just under the limit is parsed (and then judged on its content).
        fits = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 2, "user": "u" * (MAX_BODY - 200)})
        status, body = request("POST", "/v1/completions", fits)
        self.assertEqual(status, 200, body)

    def test_routes_and_methods(self):
        self.assert_error(*request("GET", "/v1/nothing"), 404)
        self.assert_error(*request("GET", "/v1/completions"), 405)
        self.assert_error(*request("POST", "/health", "{}"), 405)
        status, body = request("GET", "/health")
        self.assertEqual(status, 200, body)
        status, body = request("GET", "/v1/models")
        self.assertEqual(status, 200)
        self.assertEqual(body["data"][0]["id"], MODEL)

    def test_errors_on_one_keep_alive_connection(self):
        conn = http.client.HTTPConnection(HOST, PORT, timeout=120)
        for _ in range(3):
            self.assert_error(*request("POST", "/v1/completions", "{bad", conn=conn), 400)
            status, body = request("POST", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2},
                                   conn=conn)
            self.assertEqual(status, 200, body)
            self.assertEqual(body["usage"]["completion_tokens"] <= 2, True)
        conn.close()

    def test_full_queue_answers_503(self):
        # --max-seqs 1 --max-waiting 2: one long request runs, two wait, the next is refused. The
        # long request is the tiny model's whole context, a fraction of a second: on a loaded
        # machine it may end before the others are queued, and then nothing is refused yet. Such
        # an attempt proves nothing either way and is repeated; a server that never refuses fails
        # every attempt.
        long_request = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": CONTEXT - 16, "stream": True,
                        "ignore_eos": True}
        refused = None
        for _ in range(5):
            wait_until_idle(BASE_URL)  # requests of earlier tests (aborted by hang-ups) have left the queue
            streams = []
            try:
                first = http.client.HTTPConnection(HOST, PORT, timeout=300)
                first.request("POST", "/v1/completions", json.dumps(long_request))
                r = first.getresponse()
                self.assertEqual(r.status, 200)
                r.fp.readline()  # the first token's chunk: the request is running
                streams.append(first)
                for _ in range(2):
                    c = http.client.HTTPConnection(HOST, PORT, timeout=300)
                    c.request("POST", "/v1/completions", json.dumps(long_request))
                    self.assertEqual(c.getresponse().status, 200)  # queued; headers come at once
                    streams.append(c)
                refused = [self.completion(), self.chat(n=1)]
            finally:
                for c in streams:
                    c.close()  # hang up: the server aborts all three
            if all(status == 503 for status, _ in refused):
                break
        for status, body in refused:
            self.assert_error(status, body, 503, code="queue_full")
        m = wait_until_idle(BASE_URL)
        self.assertEqual(m["tachyon_kv_cache_usage_ratio"], 0)
        self.assertGreaterEqual(m["tachyon_requests_rejected_total"], 2)
        status, body = self.completion()  # and serves again
        self.assertEqual(status, 200, body)

    def test_too_many_choices(self):
        # n x prompts beyond --max-waiting could never be queued: 400, not 503.
        self.assert_error(*self.completion(prompt=["a", "b"], n=2), 400, param="n")


    def test_streams_validate_every_field_before_starting(self):
        # Stop strings beyond the engine's bounds: a 400 before any event, as without streaming.
        self.assert_error(*self.completion(stream=True, stop=[f"s{i}" for i in range(65)]), 400, param="stop")
        self.assert_error(*self.chat(stream=True, stop="x" * 1025), 400, param="stop")

    def test_include_usage_puts_null_usage_in_every_chunk_but_the_last(self):
        for create in (self.completion, self.chat):
            status, body = create(stream=True, stream_options={"include_usage": True}, max_tokens=3)
            self.assertEqual(status, 200, body)
            events = [json.loads(line[len("data: "):]) for line in body.splitlines()
                      if line.startswith("data: {")]
            self.assertGreater(len(events), 1, body)
            for event in events[:-1]:
                self.assertIn("usage", event, event)
                self.assertIsNone(event["usage"], event)
            self.assertEqual(events[-1]["choices"], [], events[-1])
            self.assertGreater(events[-1]["usage"]["completion_tokens"], 0, events[-1])
            # Without include_usage, no chunk has the key.
            status, body = create(stream=True, max_tokens=2)
            self.assertNotIn('"usage"', body)

    def test_overlong_url_gets_414(self):
        for path, expected in (("/v1/" + "x" * 70000, b"HTTP/1.1 414 "), ("/v1/models", b"HTTP/1.1 431 ")):
            with socket.create_connection((HOST, PORT), timeout=60) as s:
                head = f"GET {path} HTTP/1.1\r\nHost: x\r\n".encode()
                if expected.startswith(b"HTTP/1.1 431"):
                    head += b"X-Big: " + b"y" * 70000 + b"\r\n"
                try:
                    s.sendall(head + b"\r\n")
                except OSError:
                    pass  # the server may answer and close before reading all of it
                reply = b""
                while b"\r\n" not in reply:
                    data = s.recv(65536)
                    if not data:
                        break
                    reply += data
                self.assertTrue(reply.startswith(expected), reply[:100])


if __name__ == "__main__":
    unittest.main(verbosity=2)
