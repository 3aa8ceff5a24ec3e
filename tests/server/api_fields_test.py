"""Every OpenAI request field is honoured or refused with a 400 naming it, seen through the official
`openai` client (vLLM's extra fields go through extra_body=): min_tokens, stop_token_ids,
include_stop_str_in_output, return_tokens_as_token_ids, prompt_logprobs, the no-op fields, what
structured output refuses and unknown fields; /tokenize and /detokenize; CORS.

Run by tests/server/server_test.cpp against a server started with --batch-invariant
--allowed-origins http://localhost:3000. Environment: TACHYON_BASE_URL, TACHYON_MODEL_NAME,
TACHYON_MODEL_DIR, TACHYON_BINARY.
"""
import http.client
import json
import os
import subprocess
import unittest
import urllib.parse

import openai

BASE_URL = os.environ["TACHYON_BASE_URL"]
MODEL = os.environ["TACHYON_MODEL_NAME"]
MODEL_DIR = os.environ["TACHYON_MODEL_DIR"]
BINARY = os.environ["TACHYON_BINARY"]
HOST, PORT = urllib.parse.urlsplit(BASE_URL).hostname, urllib.parse.urlsplit(BASE_URL).port
ORIGIN = "http://localhost:3000"

client = openai.OpenAI(base_url=BASE_URL + "/v1", api_key="none", max_retries=0, timeout=300)

PROMPT = "func (b *Buffer) Len() int {"
MESSAGES = [{"role": "user", "content": "Write a Go function that adds two ints."}]


def tokenize_cli(text):
    """Token ids from `tachyon tokenize` (special tokens parsed, BOS added): what a text prompt runs."""
    out = subprocess.run([BINARY, "tokenize", "-m", MODEL_DIR, "-p", text, "--special"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def request(method, path, body=None, headers=None):
    """(status, headers, parsed JSON or text) of one raw request."""
    conn = http.client.HTTPConnection(HOST, PORT, timeout=120)
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    raw = r.read()
    conn.close()
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = raw.decode(errors="replace")
    return r.status, {k.lower(): v for k, v in r.getheaders()}, parsed


def greedy_ids(prompt, max_tokens):
    """The greedy completion's token ids and text (through return_tokens_as_token_ids)."""
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, logprobs=0,
                                  extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    tokens = r.choices[0].logprobs.tokens
    for t in tokens:
        assert t.startswith("token_id:"), t
    return [int(t[len("token_id:"):]) for t in tokens], r.choices[0].text


class Refusals(unittest.TestCase):
    def assert_refused(self, call, param, in_message=None):
        with self.assertRaises(openai.BadRequestError) as ctx:
            call()
        e = ctx.exception
        self.assertEqual(e.status_code, 400)
        self.assertEqual(e.param, param, e.body)
        self.assertEqual(e.body["type"], "invalid_request_error", e.body)
        self.assertIn(f"'{param}'", e.body["message"])
        if in_message:
            self.assertIn(in_message, e.body["message"])

    def test_unknown_fields_name_themselves(self):
        self.assert_refused(lambda: client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2,
                                                              extra_body={"temprature": 0.1}), "temprature")
        self.assert_refused(lambda: client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2,
                                                                   extra_body={"use_beam_search": True}),
                            "use_beam_search")
        self.assert_refused(lambda: client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2,
                                                                   extra_body={"echo": True}), "echo")

    def test_what_structured_output_does_not_do_is_refused(self):
        self.assert_refused(lambda: client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=2,
            extra_body={"guided_json": {"type": "object"}, "guided_whitespace_pattern": "[ ]*"}),
            "guided_whitespace_pattern", "'guided_whitespace_pattern' is not supported")
        self.assert_refused(lambda: client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2,
            extra_body={"guided_regex": "[a-z]+", "guided_choice": ["a"]}),
            "guided_choice", "'guided_regex' and 'guided_choice'")
        self.assert_refused(lambda: client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2, response_format={"type": "xml"}), "response_format")
        self.assert_refused(lambda: client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2, extra_body={"guided_regex": "(a"}), "guided_regex")

    def test_no_op_fields_are_accepted(self):
        r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3, temperature=0, user="u-1",
                                           metadata={"purpose": "test"}, store=False, service_tier="auto",
                                           parallel_tool_calls=False, response_format={"type": "text"},
                                           tool_choice="none", seed=3, n=1)
        self.assertEqual(len(r.choices), 1)
        plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3, temperature=0)
        self.assertEqual(r.choices[0].message.content, plain.choices[0].message.content)
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, user="u-2")
        self.assertEqual(len(r.choices), 1)
        self.assert_refused(lambda: client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2, service_tier="flex"), "service_tier")

    def test_bad_values_of_vllm_fields(self):
        self.assert_refused(lambda: client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=4, extra_body={"min_tokens": 5}), "min_tokens")
        self.assert_refused(lambda: client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=4, extra_body={"stop_token_ids": [10 ** 6]}), "stop_token_ids")
        self.assert_refused(lambda: client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=4, extra_body={"prompt_logprobs": 21}), "prompt_logprobs")
        self.assert_refused(lambda: client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=4, stream=True, extra_body={"prompt_logprobs": 1}),
            "prompt_logprobs")


class StopAndMinTokens(unittest.TestCase):
    def test_stop_token_ids_end_with_stop(self):
        ids, full = greedy_ids(PROMPT, 16)
        stop_id = ids[3]
        k = ids.index(stop_id)  # its first occurrence
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0,
                                      extra_body={"ignore_eos": True, "stop_token_ids": [stop_id]})
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertEqual(r.usage.completion_tokens, k + 1)  # the stop token counts, its text does not show
        kept = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0,
                                         extra_body={"ignore_eos": True, "stop_token_ids": [stop_id],
                                                     "include_stop_str_in_output": True})
        self.assertEqual(kept.usage.completion_tokens, k + 1)
        self.assertTrue(full.startswith(kept.choices[0].text), (full, kept.choices[0].text))
        self.assertTrue(kept.choices[0].text.startswith(r.choices[0].text))
        # Streamed, the same.
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stream=True,
            extra_body={"ignore_eos": True, "stop_token_ids": [stop_id]}) if c.choices)
        self.assertEqual(streamed, r.choices[0].text)

    def test_min_tokens_holds_off_stop_ids(self):
        ids, _ = greedy_ids(PROMPT, 16)
        first = ids[0]
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0,
                                      extra_body={"ignore_eos": True, "stop_token_ids": [first]})
        self.assertEqual(r.usage.completion_tokens, 1)
        for endpoint in ("completions", "chat"):
            kwargs = dict(model=MODEL, max_tokens=12, temperature=0, logprobs=True if endpoint == "chat" else 0,
                          extra_body={"ignore_eos": True, "stop_token_ids": [first], "min_tokens": 5,
                                      "return_tokens_as_token_ids": True})
            if endpoint == "chat":
                r = client.chat.completions.create(messages=[{"role": "user", "content": PROMPT}], **kwargs)
                got = [int(t.token[len("token_id:"):]) for t in r.choices[0].logprobs.content]
            else:
                r = client.completions.create(prompt=PROMPT, **kwargs)
                got = [int(t[len("token_id:"):]) for t in r.choices[0].logprobs.tokens]
            self.assertGreaterEqual(r.usage.completion_tokens, 5, endpoint)
            self.assertNotIn(first, got[:5], endpoint)
            if r.choices[0].finish_reason == "stop":
                self.assertEqual(got[-1], first)
                self.assertGreater(len(got), 5)

    def test_min_tokens_holds_off_stop_strings(self):
        full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text
        stop = full[:2]
        early = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stop=stop,
                                          extra_body={"ignore_eos": True})
        self.assertEqual(early.choices[0].text, "")
        late = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stop=stop,
                                         extra_body={"ignore_eos": True, "min_tokens": 6})
        self.assertGreaterEqual(late.usage.completion_tokens, 6)
        self.assertTrue(full.startswith(late.choices[0].text))

    def test_include_stop_str_in_output(self):
        full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=32, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text
        stop = full[len(full) // 2:len(full) // 2 + 3]
        expected = full[:full.find(stop) + len(stop)]
        extra = {"ignore_eos": True, "include_stop_str_in_output": True}
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=32, temperature=0, stop=[stop],
                                      extra_body=extra)
        self.assertEqual(r.choices[0].text, expected)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=32, temperature=0, stop=stop, stream=True, extra_body=extra)
            if c.choices)
        self.assertEqual(streamed, expected)
        chat_full = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0,
                                                   extra_body={"ignore_eos": True}).choices[0].message.content
        if len(chat_full) >= 8:
            stop = chat_full[4:7]
            r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0,
                                               stop=stop, extra_body=extra)
            self.assertEqual(r.choices[0].message.content, chat_full[:chat_full.find(stop) + len(stop)])


class PromptLogprobs(unittest.TestCase):
    def check_shape(self, entries, prompt_ids, n):
        self.assertEqual(len(entries), len(prompt_ids))
        self.assertIsNone(entries[0])
        for token, entry in zip(prompt_ids[1:], entries[1:]):
            self.assertIn(str(token), entry)
            self.assertLessEqual(len(entry), n + 1)
            self.assertGreaterEqual(len(entry), n)
            for key, value in entry.items():
                self.assertEqual(set(value), {"logprob", "rank", "decoded_token"})
                self.assertLessEqual(value["logprob"], 0.0)
                self.assertGreaterEqual(value["rank"], 1)
            ranks = sorted(v["rank"] for k, v in entry.items() if k != str(token) or v["rank"] <= n)
            self.assertEqual(ranks[:n], list(range(1, n + 1)))

    def test_completions(self):
        ids = tokenize_cli(PROMPT)
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0,
                                      extra_body={"prompt_logprobs": 3})
        entries = r.choices[0].model_extra["prompt_logprobs"]
        self.check_shape(entries, ids, 3)
        # The logprob of the greedy next token, asked as the prompt's last token, is the completion's
        # own logprob of it (the same distribution, from the prompt's forward).
        next_ids, _ = greedy_ids(PROMPT, 1)
        first = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0, logprobs=1)
        extended = client.completions.create(model=MODEL, prompt=ids + next_ids, max_tokens=1, temperature=0,
                                             extra_body={"prompt_logprobs": 0})
        last = extended.choices[0].model_extra["prompt_logprobs"][-1][str(next_ids[0])]
        self.assertEqual(last["rank"], 1)  # greedy: the most likely
        self.assertAlmostEqual(last["logprob"], first.choices[0].logprobs.token_logprobs[0], places=3)
        # n > 1: every choice shows its prompt's entries; batches: each prompt its own.
        r = client.completions.create(model=MODEL, prompt=[PROMPT, "package main"], max_tokens=2, n=2,
                                      temperature=0, extra_body={"prompt_logprobs": 1})
        self.assertEqual(len(r.choices), 4)
        self.assertEqual(r.choices[0].model_extra["prompt_logprobs"], r.choices[1].model_extra["prompt_logprobs"])
        self.check_shape(r.choices[2].model_extra["prompt_logprobs"], tokenize_cli("package main"), 1)

    def test_chat(self):
        r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, temperature=0,
                                           extra_body={"prompt_logprobs": 2})
        entries = r.model_extra["prompt_logprobs"]
        status, _, tok = request("POST", "/tokenize", {"model": MODEL, "messages": MESSAGES})
        self.assertEqual(status, 200, tok)
        self.assertEqual(len(entries), r.usage.prompt_tokens)
        self.check_shape(entries, tok["tokens"], 2)


class TokenizeRoutes(unittest.TestCase):
    def test_tokenize_detokenize(self):
        status, _, body = request("POST", "/tokenize", {"model": MODEL, "prompt": PROMPT})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["tokens"], tokenize_cli(PROMPT))
        self.assertEqual(body["count"], len(body["tokens"]))
        self.assertEqual(body["max_model_len"], 512)
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1)
        self.assertEqual(r.usage.prompt_tokens, body["count"])
        status, _, chat = request("POST", "/tokenize", {"messages": MESSAGES})
        self.assertEqual(status, 200, chat)
        r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)
        self.assertEqual(r.usage.prompt_tokens, chat["count"])
        status, _, text = request("POST", "/detokenize", {"tokens": body["tokens"][1:]})
        self.assertEqual(status, 200, text)
        self.assertEqual(text["prompt"], PROMPT)

    def test_mistakes(self):
        for path, body, param in (("/tokenize", {"prompt": 5}, "prompt"), ("/tokenize", {"prompt": "x", "n": 1}, "n"),
                                  ("/detokenize", {"tokens": [10 ** 7]}, "tokens"),
                                  ("/detokenize", {"tokens": [-1]}, "tokens")):
            status, _, err = request("POST", path, body)
            self.assertEqual(status, 400, err)
            self.assertEqual(err["error"]["param"], param, err)
        status, _, _ = request("GET", "/tokenize")
        self.assertEqual(status, 405)


class Cors(unittest.TestCase):
    def test_preflight_and_headers(self):
        status, headers, _ = request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        self.assertEqual(status, 200)
        self.assertEqual(headers.get("access-control-allow-origin"), ORIGIN)
        self.assertIn("POST", headers.get("access-control-allow-methods", ""))
        self.assertIn("authorization", headers.get("access-control-allow-headers", ""))
        status, headers, _ = request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1},
                                     headers={"Origin": ORIGIN})
        self.assertEqual(status, 200)
        self.assertEqual(headers.get("access-control-allow-origin"), ORIGIN)
        status, headers, _ = request("POST", "/v1/completions", {"prompt": "x", "foo": 1}, headers={"Origin": ORIGIN})
        self.assertEqual(status, 400)  # errors carry the header too, so a browser can read them
        self.assertEqual(headers.get("access-control-allow-origin"), ORIGIN)
        status, headers, _ = request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1},
                                     headers={"Origin": "https://elsewhere.example"})
        self.assertEqual(status, 200)
        self.assertNotIn("access-control-allow-origin", headers)
        status, headers, _ = request("OPTIONS", "/v1/completions", headers={
            "Origin": "https://elsewhere.example", "Access-Control-Request-Method": "POST"})
        self.assertEqual(status, 403)
        self.assertNotIn("access-control-allow-origin", headers)


if __name__ == "__main__":
    unittest.main(verbosity=2)
