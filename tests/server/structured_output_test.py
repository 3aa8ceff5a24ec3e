"""Structured output through the official `openai` client, as applications use it: JSON mode, strict
JSON schemas (response_format), vLLM's guided_json / guided_regex / guided_grammar / guided_choice and
structured_outputs (extra_body=), on both endpoints, streamed and not, with n > 1 and sampling. Every
output must parse and validate (the `jsonschema` package judges schemas; re.fullmatch judges regexes);
content quality is not judged. Batched requests without a constraint are unchanged by the ones with.

Run by tests/server/server_test.cpp against a server started with --batch-invariant. Environment:
TACHYON_BASE_URL, TACHYON_MODEL_NAME.
"""
import concurrent.futures
import json
import os
import re
import unittest

import jsonschema
import openai

BASE_URL = os.environ["TACHYON_BASE_URL"]
MODEL = os.environ["TACHYON_MODEL_NAME"]

client = openai.OpenAI(base_url=BASE_URL + "/v1", api_key="none", max_retries=0, timeout=300)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "joined": {"type": "string", "format": "date"},
        "tags": {"type": "array", "items": {"enum": ["admin", "user", "guest"]}, "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                      "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city"], "additionalProperties": False},
        "score": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 10}, {"type": "null"}]},
    },
    "required": ["name", "age", "tags", "address"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "system", "content": "You answer with JSON."},
            {"role": "user", "content": "Describe a user of the system."}]
# Bounded output (strings have a maxLength or a format, blanks between tokens are bounded by the
# server): the rest of the bundled model's 512-token context is room enough for any output the
# schema allows, so that every request ends at its EOS.
ROOM = 440


def check_schema(testcase, text, schema):
    value = json.loads(text)
    jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())
    return value


class JsonOutput(unittest.TestCase):
    def test_strict_json_schema_chat(self):
        r = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=ROOM, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                                    "strict": True}})
        choice = r.choices[0]
        self.assertEqual(choice.finish_reason, "stop", choice.message.content)
        check_schema(self, choice.message.content, PERSON)

    def test_sampled_choices_all_validate(self):
        r = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=ROOM, temperature=1.0, n=4, seed=11,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                                    "strict": True}})
        self.assertEqual(len(r.choices), 4)
        for choice in r.choices:
            self.assertEqual(choice.finish_reason, "stop", choice.message.content)
            check_schema(self, choice.message.content, PERSON)

    def test_streamed_schema_on_completions(self):
        chunks = client.completions.create(
            model=MODEL, prompt="A user record: ", max_tokens=ROOM, temperature=0.8, seed=5, stream=True,
            extra_body={"guided_json": PERSON})
        text, finish = "", None
        for c in chunks:
            text += c.choices[0].text
            finish = c.choices[0].finish_reason or finish
        self.assertEqual(finish, "stop", text)
        check_schema(self, text, PERSON)

    def test_json_mode(self):
        # Any JSON object: the model decides its length, so allow it room and judge complete outputs.
        done = 0
        for seed in range(4):
            r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=400, temperature=0.9,
                                               seed=seed, response_format={"type": "json_object"})
            content = r.choices[0].message.content
            self.assertTrue(content.lstrip().startswith("{"), content)
            if r.choices[0].finish_reason == "stop":
                self.assertIsInstance(json.loads(content), dict)
                done += 1
        self.assertGreater(done, 0, "no JSON-mode output ended within 400 tokens")


class OtherConstraints(unittest.TestCase):
    def test_regex_choice_and_grammar(self):
        pattern = r"(yes|no), because [a-z ]{1,20}\."
        for endpoint in ("chat", "completions"):
            for seed in range(3):
                if endpoint == "chat":
                    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=64, temperature=1,
                                                       seed=seed, extra_body={"guided_regex": pattern})
                    text = r.choices[0].message.content
                else:
                    r = client.completions.create(model=MODEL, prompt="Is it safe? ", max_tokens=64, temperature=1,
                                                  seed=seed, extra_body={"guided_regex": pattern})
                    text = r.choices[0].text
                self.assertEqual(r.choices[0].finish_reason, "stop", text)
                self.assertIsNotNone(re.fullmatch(pattern, text), text)
        choices = ["positive", "negative", "neutral"]
        seen = set()
        for seed in range(6):
            r = client.completions.create(model=MODEL, prompt="Sentiment: ", max_tokens=8, temperature=1.5, seed=seed,
                                          extra_body={"guided_choice": choices})
            self.assertIn(r.choices[0].text, choices)
            seen.add(r.choices[0].text)
        r = client.completions.create(model=MODEL, prompt="Direction: ", max_tokens=8, temperature=0,
                                      extra_body={"structured_outputs": {"choice": ["left", "right"]}})
        self.assertIn(r.choices[0].text, ["left", "right"])
        grammar = 'root ::= "SELECT " col (", " col)* " FROM users;"\ncol ::= "id" | "name" | "email"'
        r = client.completions.create(model=MODEL, prompt="SQL: ", max_tokens=64, temperature=1, seed=3,
                                      extra_body={"guided_grammar": grammar})
        self.assertIsNotNone(re.fullmatch(r"SELECT (id|name|email)(, (id|name|email))* FROM users;",
                                          r.choices[0].text), r.choices[0].text)

    def test_constrained_and_plain_requests_together(self):
        plain = dict(model=MODEL, prompt="func main() {", max_tokens=24, temperature=0)
        alone = client.completions.create(**plain).choices[0].text
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            constrained = [pool.submit(client.completions.create, model=MODEL, prompt="A user record: ",
                                       max_tokens=ROOM, temperature=1, seed=s, extra_body={"guided_json": PERSON})
                           for s in range(6)]
            together = [pool.submit(client.completions.create, **plain) for _ in range(2)]
            for f in constrained:
                check_schema(self, f.result().choices[0].text, PERSON)
            for f in together:
                self.assertEqual(f.result().choices[0].text, alone)


if __name__ == "__main__":
    unittest.main(verbosity=2)
