"""Disaggregated serving (prefill worker -> KV over TCP -> decode worker, behind `tachyon router`)
against one colocated `tachyon serve` on the same model, both driven by the official `openai`
client: 32 mixed requests (completions and chat, short and long prompts, stop strings, a request
that ends at its first token, n > 1, logprobs, echo, seeded sampling), each streamed and not, must
give the same text, finish reasons, usage and logprobs. Every process runs with --batch-invariant,
so a request's tokens do not depend on what else shares its steps.

Run by tests/router/disagg_server_test.cpp. Environment: TACHYON_ROUTER_URL, TACHYON_COLOCATED_URL,
TACHYON_PREFILL_URL, TACHYON_DECODE_URL, TACHYON_MODEL_NAME, TACHYON_SOURCE_DIR. The router runs
with --disagg-min-prompt 4, so the shortest prompt runs colocated on the decode worker.
"""
import concurrent.futures
import os
import unittest

import openai

from server_metrics import read_metrics, wait_until_idle

ROUTER = os.environ["TACHYON_ROUTER_URL"]
COLOCATED = os.environ["TACHYON_COLOCATED_URL"]
PREFILL = os.environ["TACHYON_PREFILL_URL"]
DECODE = os.environ["TACHYON_DECODE_URL"]
MODEL = os.environ["TACHYON_MODEL_NAME"]
SOURCE = os.environ["TACHYON_SOURCE_DIR"]

router = openai.OpenAI(base_url=ROUTER + "/v1", api_key="none", max_retries=0, timeout=120)
colocated = openai.OpenAI(base_url=COLOCATED + "/v1", api_key="none", max_retries=0, timeout=120)


def read(name):
    with open(os.path.join(SOURCE, "tests", "data", "eval", name), encoding="utf-8") as f:
        return f.read()


def cases():
    """32 requests: (endpoint, kwargs). Greedy unless a seed is given."""
    code, prose = read("code.txt"), read("prose.txt")
    out = []
    for i in range(24):
        src = code if i % 2 == 0 else prose
        start = (i * 3011) % (len(src) - 1000)
        length = 1 if i == 0 else (i * 89) % 300 + 3
        kwargs = dict(prompt=src[start:start + length], max_tokens=4 + (i * 7) % 20, temperature=0,
                      extra_body={"ignore_eos": i % 3 == 0})
        if i == 5:
            kwargs["max_tokens"] = 1  # ends at the first token: never transferred
        if i == 7:
            kwargs["logprobs"] = 2
        if i == 9:
            kwargs["echo"] = True
        if i == 11:
            kwargs.update(temperature=0.8, top_p=0.95, seed=1234)
        if i == 13:
            kwargs["n"] = 2  # several choices run colocated on the decode worker
        out.append(("completions", kwargs))
    # A stop string that the greedy continuation hits (found from the colocated server's output).
    probe = dict(prompt="func (b *Buffer) Len() int {", max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    text = colocated.completions.create(model=MODEL, **probe).choices[0].text
    out.append(("completions", dict(probe, stop=[text[6:9]])))
    out.append(("completions", dict(probe, stop=[text[0:3]])))  # at the very first token
    for i in range(6):
        messages = [{"role": "user", "content": prose[i * 500:i * 500 + 20 + i * 60]}]
        kwargs = dict(messages=messages, max_tokens=5 + i * 3, temperature=0)
        if i == 2:
            kwargs.update(logprobs=True, top_logprobs=2)
        if i == 4:
            kwargs.update(temperature=0.7, seed=99)
        out.append(("chat", kwargs))
    assert len(out) == 32
    return out


def run(client, endpoint, kwargs, stream):
    """The outcome of one request: per choice text, finish_reason and logprobs; usage; chunk ids."""
    create = client.completions.create if endpoint == "completions" else client.chat.completions.create
    if not stream:
        r = create(model=MODEL, **kwargs)
        choices = {}
        for c in r.choices:
            if endpoint == "completions":
                lp = None if c.logprobs is None else (c.logprobs.tokens, c.logprobs.token_logprobs,
                                                      c.logprobs.text_offset)
                choices[c.index] = (c.text, c.finish_reason, lp)
            else:
                lp = None if c.logprobs is None else [(t.token, t.logprob) for t in c.logprobs.content]
                choices[c.index] = (c.message.content, c.finish_reason, lp)
        return {"choices": choices, "usage": r.usage.model_dump(), "ids": {r.id[:r.id.index("-")]}}
    texts, finishes, lps, usage, ids = {}, {}, {}, None, set()
    for chunk in create(model=MODEL, stream=True, stream_options={"include_usage": True}, **kwargs):
        ids.add(chunk.id)
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
        for c in chunk.choices:
            i = c.index
            if endpoint == "completions":
                texts[i] = texts.get(i, "") + c.text
                if c.logprobs is not None:
                    prev = lps.get(i, ([], [], []))
                    lps[i] = (prev[0] + c.logprobs.tokens, prev[1] + c.logprobs.token_logprobs,
                              prev[2] + c.logprobs.text_offset)
            else:
                texts[i] = texts.get(i, "") + (c.delta.content or "")
                if c.logprobs is not None and c.logprobs.content:
                    lps[i] = lps.get(i, []) + [(t.token, t.logprob) for t in c.logprobs.content]
            if c.finish_reason is not None:
                finishes[i] = c.finish_reason
    choices = {i: (texts[i], finishes.get(i), lps.get(i)) for i in texts}
    return {"choices": choices, "usage": usage, "ids": {len(ids)}}


class DisaggregatedEqualsColocated(unittest.TestCase):
    def test_router_matches_colocated(self):
        all_cases = cases()
        jobs = [(e, k, s) for (e, k) in all_cases for s in (False, True)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            want = list(pool.map(lambda j: run(colocated, *j), jobs))
            got = list(pool.map(lambda j: run(router, *j), jobs))
        for (endpoint, kwargs, stream), g, w in zip(jobs, got, want):
            what = f"{endpoint} {'stream' if stream else 'plain'} {kwargs}"
            self.assertEqual(g["choices"], w["choices"], what)
            self.assertEqual(g["usage"], w["usage"], what)
            self.assertEqual(g["ids"], w["ids"], what)  # one id for every chunk, prefill's and decode's alike
            self.assertTrue(all(c[0] is not None for c in g["choices"].values()), what)

        # Most requests went through a transfer; the short, the n > 1 and the first-token-only
        # ones did not. The prefill worker holds no KV block afterwards.
        r = read_metrics(ROUTER)
        self.assertGreaterEqual(r['tachyon_router_requests_total{mode="disagg"}'], 40)
        self.assertGreaterEqual(r['tachyon_router_requests_total{mode="colocated"}'], 2)
        self.assertGreaterEqual(r["tachyon_router_requests_first_token_only_total"], 2)
        self.assertEqual(r["tachyon_router_requests_failed_total"], 0)
        p = wait_until_idle(PREFILL)
        d = wait_until_idle(DECODE)
        self.assertEqual(p["tachyon_kv_cache_blocks_used"], 0)
        self.assertEqual(d["tachyon_kv_cache_blocks_used"], 0)
        shipped = p['tachyon_kv_transfers_total{outcome="ok"}']
        self.assertGreaterEqual(shipped, 40)
        self.assertEqual(p['tachyon_kv_transfers_total{outcome="error"}'], 0)
        self.assertEqual(d['tachyon_kv_adoptions_total{outcome="ok"}'], shipped)
        self.assertEqual(p['tachyon_requests_finished_total{finish_reason="transfer"}'], shipped)
        # Every K/V byte went over TCP here, and the decode side copied in as many as were shipped.
        self.assertGreater(p['tachyon_kv_transfer_bytes_total{via="tcp"}'], 0)
        self.assertEqual(p['tachyon_kv_transfer_bytes_total{via="cuda_ipc"}'], 0)
        self.assertEqual(d['tachyon_kv_adopted_bytes_total{via="tcp"}'], p['tachyon_kv_transfer_bytes_total{via="tcp"}'])

    def test_bad_requests_get_the_workers_errors(self):
        for endpoint, kwargs, status in [
            ("completions", dict(prompt="x", max_tokens=0), 400),
            ("completions", dict(prompt="x", max_tokens=5, temperature=-1), 400),
            ("chat", dict(messages=[], max_tokens=5), 400),
        ]:
            for client in (router, colocated):
                create = client.completions.create if endpoint == "completions" else client.chat.completions.create
                with self.assertRaises(openai.APIStatusError) as e:
                    create(model=MODEL, **kwargs)
                self.assertEqual(e.exception.status_code, status, (endpoint, kwargs))
        with self.assertRaises(openai.NotFoundError):
            router.completions.create(model="no-such-model", prompt="x", max_tokens=2)
        self.assertEqual([m.id for m in router.models.list().data], [MODEL])


if __name__ == "__main__":
    unittest.main()
