"""Bounded load: many concurrent streaming requests from one asyncio process (AsyncOpenAI). All
complete without error, each with exactly its max_tokens; afterwards /metrics shows nothing
running or waiting and the KV cache empty. Environment: TACHYON_BASE_URL, TACHYON_MODEL_NAME;
TACHYON_LOAD_CONCURRENCY (default 256); TACHYON_EXPECT_TIMESTAMPS=1 for a server run with
--stream-timestamps: every chunk that ends a choice carries the hand-over time, earlier than its
arrival here on the same monotonic clock and by less than a minute."""
import asyncio
import os
import sys
import time
import unittest

import openai

from server_metrics import read_metrics, wait_until_idle

BASE_URL = os.environ["TACHYON_BASE_URL"]
MODEL = os.environ["TACHYON_MODEL_NAME"]
CONCURRENCY = int(os.environ.get("TACHYON_LOAD_CONCURRENCY", "256"))
MAX_TOKENS = 12
EXPECT_TIMESTAMPS = os.environ.get("TACHYON_EXPECT_TIMESTAMPS") == "1"

PROMPTS = ["func main() {", "package main\n\nimport", "The quick brown fox", "def parse(line):",
           "SELECT name FROM", "Once upon a time", "#include <stdio.h>", "// Package http provides"]


async def one(client, i):
    tokens, text, finish, usage = 0, "", None, None
    kwargs = dict(model=MODEL, max_tokens=MAX_TOKENS, temperature=0.8, seed=i, stream=True,
                  stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    if i % 2:
        stream = await client.completions.create(prompt=PROMPTS[i % len(PROMPTS)] + f" {i}", logprobs=0, **kwargs)
    else:
        stream = await client.chat.completions.create(
            messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)] + f" {i}"}], logprobs=True, **kwargs)
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        stamp = (chunk.model_extra or {}).get("tachyon_handed_over")
        if stamp is not None:
            delay = time.monotonic() - stamp
            if not 0 <= delay < 60:
                raise AssertionError(f"request {i}: handed over {delay:.6f} s before arrival")
        elif EXPECT_TIMESTAMPS and any(c.finish_reason for c in chunk.choices):
            raise AssertionError(f"request {i}: a final chunk without tachyon_handed_over: {chunk}")
        for c in chunk.choices:
            if i % 2:
                text += c.text
                tokens += len(c.logprobs.tokens) if c.logprobs else 0
            else:
                text += c.delta.content or ""
                tokens += len(c.logprobs.content) if c.logprobs and c.logprobs.content else 0
            finish = c.finish_reason or finish
    return tokens, finish, usage


class Load(unittest.TestCase):
    def test_concurrent_streams(self):
        async def run():
            async with openai.AsyncOpenAI(base_url=BASE_URL + "/v1", api_key="none", max_retries=0,
                                          timeout=600) as client:
                return await asyncio.gather(*(one(client, i) for i in range(CONCURRENCY)), return_exceptions=True)

        before = read_metrics(BASE_URL)
        results = asyncio.run(run())
        errors = [r for r in results if isinstance(r, BaseException)]
        self.assertEqual(errors, [], f"{len(errors)} of {CONCURRENCY} requests failed; first: {errors[:1]!r}")
        for tokens, finish, usage in results:
            self.assertEqual(finish, "length")
            self.assertEqual(tokens, MAX_TOKENS)
            self.assertEqual(usage.completion_tokens, MAX_TOKENS)
        m = wait_until_idle(BASE_URL)
        self.assertEqual(m["tachyon_num_requests_running"], 0)
        self.assertEqual(m["tachyon_num_requests_waiting"], 0)
        self.assertEqual(m["tachyon_kv_cache_usage_ratio"], 0)
        finished = 'tachyon_requests_finished_total{finish_reason="length"}'
        self.assertEqual(m[finished] - before[finished], CONCURRENCY)
        self.assertEqual(m["tachyon_generation_tokens_total"] - before["tachyon_generation_tokens_total"],
                         CONCURRENCY * MAX_TOKENS)
        self.assertEqual(m["tachyon_time_to_first_token_seconds_count"]
                         - before["tachyon_time_to_first_token_seconds_count"], CONCURRENCY)


if __name__ == "__main__":
    unittest.main(verbosity=2)
