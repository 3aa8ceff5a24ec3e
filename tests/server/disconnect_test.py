"""Clients that hang up mid-stream (and mid-wait, for plain requests) get their requests aborted:
afterwards /metrics shows nothing running or waiting and no KV block held, the aborts are
counted, and the server still serves. Environment: TACHYON_BASE_URL, TACHYON_MODEL_NAME."""
import asyncio
import json
import os
import unittest
import urllib.parse

from server_metrics import read_metrics, wait_until_idle

BASE_URL = os.environ["TACHYON_BASE_URL"]
MODEL = os.environ["TACHYON_MODEL_NAME"]
HOST, PORT = urllib.parse.urlsplit(BASE_URL).hostname, urllib.parse.urlsplit(BASE_URL).port
CLIENTS = 100


def raw_request(path, body):
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


async def hang_up_after_first_token(i):
    reader, writer = await asyncio.open_connection(HOST, PORT)
    long_request = {"model": MODEL, "max_tokens": 400, "stream": True, "ignore_eos": True, "temperature": 0.7,
                    "seed": i}
    if i % 2:
        writer.write(raw_request("/v1/completions", dict(prompt=f"Once upon a time {i}", **long_request)))
        first_event = b'"text":'
    else:
        writer.write(raw_request("/v1/chat/completions",
                                 dict(messages=[{"role": "user", "content": f"Tell me a story {i}"}], **long_request)))
        first_event = b'"content":"'  # the role chunk carries "content":"" first; wait for real content
    await writer.drain()
    status = await reader.readline()
    assert status.startswith(b"HTTP/1.1 200"), status
    seen = b""
    while True:  # until a token arrived
        line = await reader.readline()
        assert line, "the server closed the stream early"
        seen += line
        if first_event in line and b'"content":""' not in line:
            break
    writer.close()  # hang up mid-stream
    await writer.wait_closed()


async def hang_up_while_waiting(i):
    reader, writer = await asyncio.open_connection(HOST, PORT)
    writer.write(raw_request("/v1/completions", {"model": MODEL, "prompt": f"story {i}", "max_tokens": 400,
                                                 "ignore_eos": True}))
    await writer.drain()
    await asyncio.sleep(0.01)
    writer.close()
    await writer.wait_closed()


class Disconnects(unittest.TestCase):
    def test_hang_ups_free_their_blocks(self):
        before = read_metrics(BASE_URL)

        async def run():
            await asyncio.gather(*(hang_up_after_first_token(i) for i in range(CLIENTS)))
            await asyncio.gather(*(hang_up_while_waiting(i) for i in range(20)))

        asyncio.run(run())
        m = wait_until_idle(BASE_URL)
        self.assertEqual(m["tachyon_num_requests_running"], 0)
        self.assertEqual(m["tachyon_num_requests_waiting"], 0)
        self.assertEqual(m["tachyon_kv_cache_usage_ratio"], 0)
        self.assertEqual(m["tachyon_kv_cache_blocks_used"], 0)
        # Every mid-stream hang-up aborted a running request. (A plain request whose client left
        # before the engine took it is dropped without ever running, so it is not counted.)
        aborted = 'tachyon_requests_finished_total{finish_reason="abort"}'
        self.assertGreaterEqual(m[aborted] - before[aborted], CLIENTS)
        # Generation went far less than the 400 tokens each request asked for.
        generated = m["tachyon_generation_tokens_total"] - before["tachyon_generation_tokens_total"]
        self.assertLess(generated, (CLIENTS + 20) * 400)

        # The server still serves.
        async def one():
            reader, writer = await asyncio.open_connection(HOST, PORT)
            writer.write(raw_request("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 3}))
            await writer.drain()
            status = await reader.readline()
            writer.close()
            return status

        self.assertTrue(asyncio.run(one()).startswith(b"HTTP/1.1 200"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
