"""Helpers shared by the server test scripts: /metrics parsing and waiting for the engine to idle."""
import time
import urllib.request


def read_metrics(base_url):
    """Every sample of GET /metrics as {"name{labels}": value}."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=60) as r:
        assert r.status == 200, r.status
        text = r.read().decode()
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, value = line.rsplit(" ", 1)
        samples[name] = float(value)
    return samples


def wait_until_idle(base_url, limit_s=120.0):
    """Polls /metrics until nothing runs or waits and no KV block is held; returns the samples.
    The limit only bounds a hang: the test asserts the state reached, not how fast."""
    deadline = time.monotonic() + limit_s
    while True:
        m = read_metrics(base_url)
        idle = (m["tachyon_num_requests_running"] == 0 and m["tachyon_num_requests_waiting"] == 0
                and m["tachyon_kv_cache_usage_ratio"] == 0 and m["tachyon_kv_cache_blocks_used"] == 0)
        if idle or time.monotonic() > deadline:
            return m
        time.sleep(0.05)
