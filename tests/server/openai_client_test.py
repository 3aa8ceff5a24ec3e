"""tachyon serve driven by the official `openai` client: completions and chat, streaming and not,
n > 1, stop sequences, seeds, usage counts, logprobs, echo, and the model's chat template.

Run by tests/server/server_test.cpp against a server it started with --batch-invariant (so a
request's tokens do not depend on what else is batched). Environment: TACHYON_BASE_URL,
TACHYON_MODEL_NAME, TACHYON_MODEL_DIR (for the tokenizer), TACHYON_BINARY.
"""
import json
import os
import subprocess
import unittest

import openai

BASE_URL = os.environ["TACHYON_BASE_URL"]
MODEL = os.environ["TACHYON_MODEL_NAME"]
MODEL_DIR = os.environ["TACHYON_MODEL_DIR"]
BINARY = os.environ["TACHYON_BINARY"]

client = openai.OpenAI(base_url=BASE_URL + "/v1", api_key="none", max_retries=0, timeout=300)

PROMPT = "func (b *Buffer) Len() int {"


def tokenize(text, special=True, bos=True):
    """Token ids from `tachyon tokenize`: the oracle for prompt_tokens."""
    args = [BINARY, "tokenize", "-m", MODEL_DIR, "-p", text]
    if special:
        args.append("--special")
    if not bos:
        args.append("--no-bos")
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def tokenizer_config():
    with open(os.path.join(MODEL_DIR, "tokenizer_config.json")) as f:
        return json.load(f)


def render_chatml(messages, bos):
    """The bundled model's template (ChatML after the BOS text), written out by hand."""
    text = bos
    for m in messages:
        text += "<|im_start|>" + m["role"] + "\n" + m["content"] + "<|im_end|>\n"
    return text + "<|im_start|>assistant\n"


class Completions(unittest.TestCase):
    def test_response_shape_and_usage(self):
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
        self.assertTrue(r.id.startswith("cmpl-"), r.id)
        self.assertEqual(r.object, "text_completion")
        self.assertEqual(r.model, MODEL)
        self.assertIsInstance(r.created, int)
        self.assertEqual(len(r.choices), 1)
        c = r.choices[0]
        self.assertEqual(c.index, 0)
        self.assertIn(c.finish_reason, ("stop", "length"))
        self.assertIsNone(c.logprobs)
        self.assertEqual(r.usage.prompt_tokens, len(tokenize(PROMPT)))
        self.assertGreaterEqual(r.usage.completion_tokens, 1)
        self.assertLessEqual(r.usage.completion_tokens, 12)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)

    def test_max_tokens_finishes_with_length(self):
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=7, temperature=0,
                                      extra_body={"ignore_eos": True})
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 7)

    def test_stream_equals_plain_and_counts_tokens(self):
        plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0,
                                          extra_body={"ignore_eos": True})
        text, streamed_tokens, finish, usage = "", 0, None, None
        stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stream=True,
                                           logprobs=0, stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True})
        for chunk in stream:
            if chunk.usage is not None:
                self.assertEqual(chunk.choices, [])
                usage = chunk.usage
                continue
            self.assertEqual(len(chunk.choices), 1)
            c = chunk.choices[0]
            text += c.text
            if c.logprobs is not None:
                streamed_tokens += len(c.logprobs.tokens)
            if c.finish_reason is not None:
                finish = c.finish_reason
        self.assertEqual(text, plain.choices[0].text)
        self.assertEqual(finish, "length")
        self.assertIsNotNone(usage)
        self.assertEqual(usage.completion_tokens, 20)
        self.assertEqual(streamed_tokens, usage.completion_tokens)
        self.assertEqual(usage.prompt_tokens, len(tokenize(PROMPT)))
        self.assertEqual(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens)

    def test_n_choices_use_consecutive_seeds(self):
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, n=3, temperature=1.0, seed=11,
                                      extra_body={"ignore_eos": True})
        self.assertEqual([c.index for c in r.choices], [0, 1, 2])
        self.assertEqual(r.usage.prompt_tokens, len(tokenize(PROMPT)))
        self.assertEqual(r.usage.completion_tokens, 3 * 8)
        for j in range(3):
            alone = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=11 + j,
                                              extra_body={"ignore_eos": True})
            self.assertEqual(r.choices[j].text, alone.choices[0].text, f"choice {j}")

    def test_same_seed_same_text(self):
        kwargs = dict(model=MODEL, prompt="Once upon a time", max_tokens=24, temperature=1.0, top_p=0.95, seed=1234,
                      extra_body={"ignore_eos": True})
        a = client.completions.create(**kwargs)
        b = client.completions.create(**kwargs)
        self.assertEqual(a.choices[0].text, b.choices[0].text)
        s = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kwargs) if c.choices)
        self.assertEqual(s, a.choices[0].text)

    def test_stop_sequences(self):
        full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=32, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text
        self.assertGreater(len(full), 8, full)
        stop = full[len(full) // 2:len(full) // 2 + 3]
        expected = full[:full.find(stop)]
        for form in (stop, [stop], ["never-appears-here", stop]):
            r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=32, temperature=0, stop=form,
                                          extra_body={"ignore_eos": True})
            self.assertEqual(r.choices[0].text, expected, f"stop={form!r} in {full!r}")
            self.assertEqual(r.choices[0].finish_reason, "stop")
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=32, temperature=0, stop=stop, stream=True,
            extra_body={"ignore_eos": True}) if c.choices)
        self.assertEqual(streamed, expected)

    def test_logprobs_shape(self):
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3,
                                      extra_body={"ignore_eos": True})
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 6)
        self.assertEqual(len(lp.token_logprobs), 6)
        self.assertEqual(len(lp.top_logprobs), 6)
        self.assertEqual(len(lp.text_offset), 6)
        self.assertEqual(lp.text_offset[0], 0)
        self.assertEqual(lp.text_offset, sorted(lp.text_offset))
        for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            self.assertLessEqual(value, 0.0)
            self.assertTrue(1 <= len(top) <= 3, top)
            # Greedy: the chosen token is the most likely one.
            self.assertAlmostEqual(value, max(top.values()), places=4)

    def test_echo(self):
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, echo=True)
        plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0)
        self.assertEqual(r.choices[0].text, PROMPT + plain.choices[0].text)
        chunks = [c.choices[0].text for c in client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, echo=True, stream=True) if c.choices]
        self.assertEqual(chunks[0], PROMPT)
        self.assertEqual("".join(chunks), r.choices[0].text)

    def test_token_id_and_batch_prompts(self):
        ids = tokenize(PROMPT)
        by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
        by_text = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
        self.assertEqual(by_ids.usage.prompt_tokens, len(ids))
        self.assertEqual(by_ids.choices[0].text, by_text.choices[0].text)
        second = "package main"
        batch = client.completions.create(model=MODEL, prompt=[PROMPT, second], max_tokens=6, n=2, temperature=0,
                                          extra_body={"ignore_eos": True})
        self.assertEqual([c.index for c in batch.choices], [0, 1, 2, 3])
        self.assertEqual(batch.usage.prompt_tokens, len(ids) + len(tokenize(second)))
        self.assertEqual(batch.usage.completion_tokens, 4 * 6)
        self.assertEqual(batch.choices[0].text, by_text.choices[0].text)
        self.assertEqual(batch.choices[1].text, by_text.choices[0].text)  # greedy: both choices agree

    def test_stream_with_n(self):
        texts, finished = {}, set()
        for chunk in client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, n=2, temperature=0,
                                               stream=True, extra_body={"ignore_eos": True}):
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + c.text
                if c.finish_reason:
                    finished.add(c.index)
        self.assertEqual(finished, {0, 1})
        self.assertEqual(texts[0], texts[1])


class Chat(unittest.TestCase):
    MESSAGES = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Write a Go function that adds two ints."}]

    def test_prompt_tokens_follow_the_models_template(self):
        bos = tokenizer_config()["bos_token"]
        rendered = render_chatml(self.MESSAGES, bos)
        ids = tokenize(rendered, special=True, bos=False)
        bos_id = tokenize("", bos=True)[0]
        self.assertEqual(ids[0], bos_id)
        self.assertNotEqual(ids[1], bos_id)  # one BOS, from the template
        r = client.chat.completions.create(model=MODEL, messages=self.MESSAGES, max_tokens=4, temperature=0)
        self.assertEqual(r.usage.prompt_tokens, len(ids))
        # The same prompt sent as a completion (token ids) continues identically.
        c = client.completions.create(model=MODEL, prompt=ids, max_tokens=4, temperature=0)
        self.assertEqual(r.choices[0].message.content, c.choices[0].text)

    def test_response_shape(self):
        r = client.chat.completions.create(model=MODEL, messages=self.MESSAGES, max_completion_tokens=6,
                                           temperature=0, extra_body={"ignore_eos": True})
        self.assertTrue(r.id.startswith("chatcmpl-"), r.id)
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.model, MODEL)
        self.assertEqual(len(r.choices), 1)
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 6)

    def test_stream_equals_plain(self):
        plain = client.chat.completions.create(model=MODEL, messages=self.MESSAGES, max_tokens=16, temperature=0)
        roles, content, finish, usage = [], "", None, None
        for chunk in client.chat.completions.create(model=MODEL, messages=self.MESSAGES, max_tokens=16, temperature=0,
                                                    stream=True, stream_options={"include_usage": True}):
            self.assertEqual(chunk.object, "chat.completion.chunk")
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                if c.delta.role:
                    roles.append(c.delta.role)
                content += c.delta.content or ""
                finish = c.finish_reason or finish
        self.assertEqual(roles, ["assistant"])
        self.assertEqual(content, plain.choices[0].message.content)
        self.assertEqual(finish, plain.choices[0].finish_reason)
        self.assertEqual(usage.completion_tokens, plain.usage.completion_tokens)
        self.assertEqual(usage.prompt_tokens, plain.usage.prompt_tokens)

    def test_logprobs(self):
        r = client.chat.completions.create(model=MODEL, messages=self.MESSAGES, max_tokens=5, temperature=0,
                                           logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        for entry in content:
            self.assertLessEqual(entry.logprob, 0.0)
            self.assertEqual(bytes(entry.bytes).decode("utf-8", "replace"), entry.token)
            self.assertEqual(len(entry.top_logprobs), 2)
            self.assertAlmostEqual(entry.logprob, entry.top_logprobs[0].logprob, places=4)
        streamed = 0
        for chunk in client.chat.completions.create(model=MODEL, messages=self.MESSAGES, max_tokens=5, temperature=0,
                                                    logprobs=True, stream=True, extra_body={"ignore_eos": True}):
            for c in chunk.choices:
                if c.logprobs is not None and c.logprobs.content:
                    streamed += len(c.logprobs.content)
        self.assertEqual(streamed, 5)

    def test_n_and_seed(self):
        kwargs = dict(model=MODEL, messages=self.MESSAGES, max_tokens=8, temperature=1.0, seed=5,
                      extra_body={"ignore_eos": True})
        r = client.chat.completions.create(n=2, **kwargs)
        self.assertEqual([c.index for c in r.choices], [0, 1])
        self.assertEqual(r.usage.completion_tokens, 16)
        alone = client.chat.completions.create(**kwargs)
        self.assertEqual(r.choices[0].message.content, alone.choices[0].message.content)

    def test_content_parts(self):
        parts = [{"role": "user", "content": [{"type": "text", "text": "Write a Go function"},
                                              {"type": "text", "text": "that adds two ints."}]}]
        joined = [{"role": "user", "content": "Write a Go function\nthat adds two ints."}]
        a = client.chat.completions.create(model=MODEL, messages=parts, max_tokens=6, temperature=0)
        b = client.chat.completions.create(model=MODEL, messages=joined, max_tokens=6, temperature=0)
        self.assertEqual(a.usage.prompt_tokens, b.usage.prompt_tokens)
        self.assertEqual(a.choices[0].message.content, b.choices[0].message.content)


class Models(unittest.TestCase):
    def test_list(self):
        models = list(client.models.list())
        self.assertEqual([m.id for m in models], [MODEL])
        self.assertEqual(client.models.retrieve(MODEL).id, MODEL)


if __name__ == "__main__":
    unittest.main(verbosity=2)
