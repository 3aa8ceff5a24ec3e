#!/usr/bin/env python3
"""Load generator for `tachyon serve`: output tokens/s through HTTP streaming, and what the
network path adds per token compared with the engine driven in-process (`tachyon bench`).

The workload is `tachyon bench --workload throughput --len-sigma 0`'s: N requests of random token
ids (P prompt tokens each, ids in [16, vocab)), greedy, EOS ignored so that each generates exactly
G tokens, at most C in flight, all at once or as seeded Poisson arrivals at --request-rate R per
second (a request's TTFT counts from when it is sent). Requests go to /v1/completions with the
prompt as token ids, "stream": true and "logprobs": 0 (so every event says how many tokens it
carries). The client is asyncio over raw sockets (HTTP/1.1, chunked SSE parsing by hand) to keep
its own cost small.

    .venv/bin/python bench/serve_load.py --base-url http://127.0.0.1:8000 -n 64 --prompt-len 128 \
        --output-len 64 --concurrency 16 [--request-rate 8] [--slo-ttft 1 --slo-tpot 0.05] \
        [--processes 4 --client-cpus 8-15] [--bench-binary build/tachyon --bench-model MODEL] [--json out.json]

With --processes K > 1 the client work is spread over K processes, for rates where one Python
process parsing every event is the bottleneck: the workload is drawn as with one (same seed, same
prompts and arrival times) and dealt round-robin, each process runs its share with at most
ceil(C / K) in flight, all start at one CLOCK_MONOTONIC instant that the arrivals count from, and
the figures are computed over the merged requests and the common wall time. --client-cpus LIST
(e.g. 8-15 or 8,9,10) pins the client processes: one CPU each, in turn, when K <= the CPUs given,
else all share them.

With --slo-ttft and/or --slo-tpot (seconds), goodput is reported as `tachyon bench` reports it: the
requests that finished with TTFT and mean TPOT within the targets, their share and their rate over
the run's wall time (JSON "goodput"; a one-token request meets the TPOT target, a failed one none).

With --bench-binary, `tachyon bench` then runs the same workload in-process (after the HTTP run,
so the two never compete for the CPU; give it the engine options the server got, after --) and
the comparison is printed: output tokens/s of each, and the mean inter-token latency and TTFT
the server adds. Against a server started with --stream-timestamps, the latency that delivery adds
to every token (engine hand-over to the client's parse) is measured directly, p50/p99/max.
"""
import argparse
import asyncio
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.parse
import urllib.request


def percentile(values, q):
    if not values:
        return 0.0
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def summary_ms(values):
    return {"mean": statistics.fmean(values) * 1e3 if values else 0.0, "p50": percentile(values, 0.5) * 1e3,
            "p90": percentile(values, 0.9) * 1e3, "p99": percentile(values, 0.99) * 1e3,
            "max": max(values) * 1e3 if values else 0.0, "count": len(values)}


class Result:
    def __init__(self):
        self.start = 0.0
        self.token_times = []  # arrival time of each token (tokens of one event share its time)
        self.delivery = []     # per token: arrival - the server's hand-over (--stream-timestamps)
        self.end = 0.0
        self.error = None

    def latency(self):
        """(ttft, tpot, output tokens) as `tachyon bench` measures them; None for a failed request."""
        if self.error is not None:
            return None
        n = len(self.token_times)
        ttft = self.token_times[0] - self.start if n else 0.0
        tpot = (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else 0.0
        return ttft, tpot, n


def meets_slo(latency, slo_ttft, slo_tpot):
    """src/cli/goodput.h's meets_slo: targets in seconds, 0 = none; a one-token request has no TPOT."""
    if latency is None or latency[2] < 1:
        return False
    ttft, tpot, n = latency
    if slo_ttft > 0 and not ttft <= slo_ttft:
        return False
    return not (slo_tpot > 0 and n > 1 and not tpot <= slo_tpot)


def goodput(latencies, slo_ttft, slo_tpot, duration):
    """src/cli/goodput.h's compute_goodput over Result.latency() of every request, as bench's JSON."""
    meeting = sum(1 for r in latencies if meets_slo(r, slo_ttft, slo_tpot))
    return {"slo_ttft_s": slo_ttft if slo_ttft > 0 else None, "slo_tpot_s": slo_tpot if slo_tpot > 0 else None,
            "requests": len(latencies), "requests_meeting": meeting,
            "fraction": meeting / len(latencies) if latencies else 0.0,
            "requests_per_s": meeting / duration if duration > 0 else 0.0}


def describe_slo(slo_ttft, slo_tpot):
    """"TTFT 1 s, TPOT 50 ms": the given targets, in s from one second up and in ms below."""
    seconds = lambda s: f"{s:g} s" if s >= 1 else f"{s * 1e3:g} ms"
    return ", ".join(f"{name} {seconds(target)}" for name, target in (("TTFT", slo_ttft), ("TPOT", slo_tpot))
                     if target > 0)


async def one_request(host, port, path, body, result):
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
    result.start = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(head + data)
        await writer.drain()
        status = await reader.readline()
        if not status.startswith(b"HTTP/1.1 200"):
            rest = await reader.read()
            raise RuntimeError(f"{status.decode().strip()}: {rest[-300:]!r}")
        while (await reader.readline()) not in (b"\r\n", b""):
            pass  # headers
        buffer = b""
        done = False
        while not done:
            size_line = await reader.readline()
            if not size_line:
                raise RuntimeError("the stream ended without [DONE]")
            size = int(size_line.strip(), 16)
            if size == 0:
                break
            buffer += await reader.readexactly(size)
            await reader.readexactly(2)  # CRLF after the chunk
            now = time.perf_counter()
            now_monotonic = time.monotonic()
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    continue
                payload = event[6:]
                if payload == b"[DONE]":
                    done = True
                    break
                obj = json.loads(payload)
                if "error" in obj:
                    raise RuntimeError(obj["error"]["message"])
                for choice in obj["choices"]:
                    lp = choice.get("logprobs")
                    n = len(lp["tokens"]) if lp else 0
                    result.token_times.extend([now] * n)
                    if "tachyon_handed_over" in obj:
                        result.delivery.extend([now_monotonic - obj["tachyon_handed_over"]] * n)
        result.end = time.perf_counter()
    finally:
        writer.close()


def draw_workload(args, vocab):
    """(prompts, arrivals): the warm-up prompts then the measured ones, and each measured request's
    arrival in seconds after the start of the measured run, all drawn from --seed."""
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(min(16, vocab - 1), vocab) for _ in range(args.prompt_len)]
               for _ in range(args.num_prompts + args.warmup)]
    arrivals = []  # seconds after the start of the measured run
    t = 0.0
    for _ in range(args.num_prompts):
        if args.request_rate > 0:
            t += rng.expovariate(args.request_rate)
        arrivals.append(t)
    return prompts, arrivals


def request_body(args, model, prompt):
    return {"model": model, "prompt": prompt, "max_tokens": args.output_len, "temperature": 0,
            "ignore_eos": True, "stream": True, "logprobs": 0}


async def run_load(args, vocab, model):
    url = urllib.parse.urlsplit(args.base_url)
    prompts, arrivals = draw_workload(args, vocab)

    def body(prompt):
        return request_body(args, model, prompt)

    for p in prompts[:args.warmup]:  # warm-up, not measured
        await one_request(url.hostname, url.port, "/v1/completions", body(p), Result())
    semaphore = asyncio.Semaphore(args.concurrency if args.concurrency > 0 else len(prompts))
    results = [Result() for _ in range(args.num_prompts)]

    async def limited(p, r, arrival):
        await asyncio.sleep(max(0.0, t0 + arrival - time.perf_counter()))
        async with semaphore:
            try:
                await one_request(url.hostname, url.port, "/v1/completions", body(p), r)
            except Exception as e:  # counted, reported below
                r.error = e

    t0 = time.perf_counter()
    await asyncio.gather(*(limited(p, r, a) for p, r, a in zip(prompts[args.warmup:], results, arrivals)))
    return results, time.perf_counter() - t0


def parse_cpu_list(text):
    """"8-15", "8,9,10", "0-3,8": the CPUs, in the order given, without repeats."""
    cpus = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        first, last = int(lo), int(hi) if hi else int(lo)
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {part.strip()!r}")
        cpus.extend(c for c in range(first, last + 1) if c not in cpus)
    if not cpus:
        raise ValueError("no CPUs")
    return cpus


def client_cpus(cpus, processes, i):
    """The CPUs of client process i of `processes`: one each, in turn, when there are enough, else all."""
    if not cpus:
        return None
    return [cpus[i % len(cpus)]] if processes <= len(cpus) else list(cpus)


def portable_error(e):
    """e if it survives pickling (to be sent to the parent), else a RuntimeError with its repr."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(repr(e))


async def run_share(host, port, share, concurrency, start):
    """One client process's part of the measured run: share = [(index, body, arrival)], arrivals in
    seconds after `start` (CLOCK_MONOTONIC). Returns [(index, start, end, token_times, delivery,
    error)] with times in seconds after `start`, and the time this process finished, likewise."""
    t0 = start - (time.monotonic() - time.perf_counter())  # `start` on the perf_counter clock
    await asyncio.sleep(max(0.0, t0 - time.perf_counter()))
    semaphore = asyncio.Semaphore(max(1, concurrency))
    results = [Result() for _ in share]

    async def limited(body, r, arrival):
        await asyncio.sleep(max(0.0, t0 + arrival - time.perf_counter()))
        async with semaphore:
            try:
                await one_request(host, port, "/v1/completions", body, r)
            except Exception as e:  # counted, reported by the parent
                r.error = e

    await asyncio.gather(*(limited(body, r, a) for (_, body, a), r in zip(share, results)))
    finish = time.perf_counter() - t0
    return [(index, r.start - t0, r.end - t0, [x - t0 for x in r.token_times], r.delivery,
             None if r.error is None else portable_error(r.error))
            for (index, _, _), r in zip(share, results)], finish


def load_worker(conn, host, port, share, concurrency, cpus):
    """A client process: pins itself, says "ready", waits for the common start, runs its share and
    sends back ("done", results, finish) or ("failed", traceback)."""
    try:
        if cpus:
            os.sched_setaffinity(0, cpus)
        conn.send("ready")
        start = conn.recv()
        conn.send(("done", *asyncio.run(run_share(host, port, share, concurrency, start))))
    except BaseException:
        try:
            conn.send(("failed", traceback.format_exc()))
        except Exception:
            pass
    finally:
        conn.close()


def run_load_processes(args, vocab, model, cpus):
    """run_load over args.processes client processes: the same workload, dealt round-robin, started
    together; returns the merged results (in request order) and the wall time from the common start
    to the last process's finish."""
    url = urllib.parse.urlsplit(args.base_url)
    prompts, arrivals = draw_workload(args, vocab)

    async def warmup():
        for p in prompts[:args.warmup]:  # warm-up, not measured
            await one_request(url.hostname, url.port, "/v1/completions", request_body(args, model, p), Result())

    asyncio.run(warmup())
    processes = args.processes
    concurrency = math.ceil(args.concurrency / processes) if args.concurrency > 0 else 0
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    workers = []  # (process, the parent's end of its pipe)

    def receive(process, conn):
        try:
            message = conn.recv()
        except EOFError:
            process.join(5)
            raise RuntimeError(f"client process {process.pid} exited (code {process.exitcode}) without reporting")
        if isinstance(message, tuple) and message[0] == "failed":
            raise RuntimeError(f"client process {process.pid} failed:\n{message[1]}")
        return message

    try:
        for i in range(processes):
            share = [(j, request_body(args, model, prompts[args.warmup + j]), arrivals[j])
                     for j in range(i, args.num_prompts, processes)]
            parent_end, child_end = context.Pipe()
            process = context.Process(target=load_worker, daemon=True,
                                      args=(child_end, url.hostname, url.port, share,
                                            concurrency or len(share), client_cpus(cpus, processes, i)))
            process.start()
            child_end.close()
            workers.append((process, parent_end))
        for process, conn in workers:
            if receive(process, conn) != "ready":
                raise RuntimeError(f"client process {process.pid} sent an unexpected message")
        start = time.monotonic() + 0.25  # every process is waiting on its pipe: ample time to wake
        for _, conn in workers:
            conn.send(start)
        results = [Result() for _ in range(args.num_prompts)]
        duration = 0.0
        pending = {conn: process for process, conn in workers}
        while pending:
            for conn in multiprocessing.connection.wait(list(pending)):
                _, share, finish = receive(pending.pop(conn), conn)
                duration = max(duration, finish)
                for index, begin, end, token_times, delivery, error in share:
                    r = results[index]
                    r.start, r.end, r.token_times, r.delivery, r.error = begin, end, token_times, delivery, error
        for process, _ in workers:
            process.join()
        return results, duration
    finally:
        for process, conn in workers:
            conn.close()
            if process.is_alive():
                process.terminate()
                process.join()


def get_json(base_url, path):
    with urllib.request.urlopen(base_url + path, timeout=60) as r:
        return json.loads(r.read())


def server_histograms(base_url):
    """(sum, count) of the server's own TTFT and TPOT histograms (engine clock), from /metrics."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=60) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    get = lambda name: (values.get(name + "_sum", 0.0), values.get(name + "_count", 0.0))
    return {"ttft": get("tachyon_time_to_first_token_seconds"), "tpot": get("tachyon_time_per_output_token_seconds"),
            "prefix": (values.get("tachyon_prefix_cache_hits_total", 0.0),
                       values.get("tachyon_prefix_cache_queries_total", 0.0))}


def histogram_mean_ms(before, after):
    count = after[1] - before[1]
    return (after[0] - before[0]) / count * 1e3 if count > 0 else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", help="served model name (default: the server's only model)")
    ap.add_argument("-n", "--num-prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16, help="requests in flight at most; 0 = all")
    ap.add_argument("--request-rate", type=float, default=0.0,
                    help="Poisson arrivals per second, drawn from --seed; 0 = all at once (default)")
    ap.add_argument("--slo-ttft", type=float, default=0.0, help="goodput target on TTFT, seconds (default 0: none)")
    ap.add_argument("--slo-tpot", type=float, default=0.0,
                    help="goodput target on a request's mean TPOT, seconds (default 0: none)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--processes", type=int, default=1,
                    help="client processes the requests are dealt to, ceil(concurrency / processes) in flight each (default 1)")
    ap.add_argument("--client-cpus", metavar="LIST",
                    help="pin the client processes to these CPUs, e.g. 8-15 or 8,9,10 (default: no pinning)")
    ap.add_argument("--seed", type=int, help="prompt seed (default: a fresh one, so that a running server's "
                    "prefix cache holds none of the prompts)")
    ap.add_argument("--vocab", type=int, default=0, help="prompt ids are drawn below this (default: from "
                    "--bench-model's config.json, else 8192)")
    ap.add_argument("--bench-binary", help="also run `BINARY bench` on the same workload and compare")
    ap.add_argument("--bench-model", help="-m for the in-process run")
    ap.add_argument("--json", help="write every figure to this file")
    ap.add_argument("bench_args", nargs="*", help="after --: engine options for `tachyon bench` (as the server's)")
    args = ap.parse_args()
    if not (args.request_rate >= 0 and args.slo_ttft >= 0 and args.slo_tpot >= 0):
        ap.error("--request-rate, --slo-ttft and --slo-tpot must not be negative")
    if args.processes < 1:
        ap.error("--processes must be at least 1")
    cpus = None
    if args.client_cpus is not None:
        if not hasattr(os, "sched_setaffinity"):
            ap.error("--client-cpus needs os.sched_setaffinity (Linux)")
        try:
            cpus = parse_cpu_list(args.client_cpus)
        except ValueError as e:
            ap.error(f"--client-cpus {args.client_cpus!r}: {e}")
        unavailable = sorted(set(cpus) - os.sched_getaffinity(0))
        if unavailable:
            ap.error(f"--client-cpus: CPUs {unavailable} are not available to this process "
                     f"(available: {sorted(os.sched_getaffinity(0))})")
        # This process: the one client when P = 1, else the parent (warm-up, merging) on all of them.
        os.sched_setaffinity(0, client_cpus(cpus, 1, 0) if args.processes == 1 else cpus)
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)

    try:
        model = args.model or get_json(args.base_url, "/v1/models")["data"][0]["id"]
        before = server_histograms(args.base_url)
    except OSError as e:
        sys.exit(f"serve_load.py: no server answers at {args.base_url}: {e}")
    vocab = args.vocab
    if not vocab and args.bench_model and os.path.isfile(os.path.join(args.bench_model, "config.json")):
        with open(os.path.join(args.bench_model, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
    vocab = vocab or 8192

    if args.processes == 1:
        results, duration = asyncio.run(run_load(args, vocab, model))
    else:
        results, duration = run_load_processes(args, vocab, model, cpus)
    try:
        after = server_histograms(args.base_url)
    except OSError as e:  # the server went away during the run: the client's figures still stand
        after = None
        print(f"serve_load.py: no /metrics after the run, no server-side figures: {e}", file=sys.stderr)
    errors = [r.error for r in results if r.error is not None]
    ok = [r for r in results if r.error is None]
    output_tokens = sum(len(r.token_times) for r in ok)
    ttft = [r.token_times[0] - r.start for r in ok if r.token_times]
    itl = [b - a for r in ok for a, b in zip(r.token_times, r.token_times[1:])]
    tpot = [(r.token_times[-1] - r.token_times[0]) / (len(r.token_times) - 1) for r in ok if len(r.token_times) > 1]
    e2e = [r.end - r.start for r in ok]
    out = {
        "bench": "http", "base_url": args.base_url, "model": model,
        "config": {"num_requests": args.num_prompts, "prompt_len": args.prompt_len, "output_len": args.output_len,
                   "concurrency": args.concurrency, "request_rate": args.request_rate, "seed": args.seed,
                   **({"client_processes": args.processes} if args.processes > 1 else {}),
                   **({"client_cpus": cpus} if cpus else {})},
        "errors": len(errors), "duration_s": duration,
        "requests_per_s": len(ok) / duration, "output_tokens": output_tokens,
        "output_tokens_per_s": output_tokens / duration,
        "ttft_ms": summary_ms(ttft), "tpot_ms": summary_ms(tpot), "itl_ms": summary_ms(itl), "e2e_ms": summary_ms(e2e),
    }
    with_slo = args.slo_ttft > 0 or args.slo_tpot > 0
    if with_slo:
        out["goodput"] = goodput([r.latency() for r in results], args.slo_ttft, args.slo_tpot, duration)
    # The server's own view (engine clock, warm-up requests included): what is left of the client's
    # figures is delivery (formatting, sockets, the client's parsing).
    delivery = [d for r in ok for d in r.delivery]
    if delivery:
        # The server ran with --stream-timestamps: the time from the engine loop handing a token
        # over to this client parsing it (both clocks CLOCK_MONOTONIC of this host).
        out["delivery_ms"] = summary_ms(delivery)
        print(f"delivery (engine hand-over -> client): {len(delivery)} tokens | p50 "
              f"{out['delivery_ms']['p50']:.3f} ms | p99 {out['delivery_ms']['p99']:.3f} ms | max "
              f"{out['delivery_ms']['max']:.3f} ms")
    if after is not None:
        out["server_side"] = {"ttft_mean_ms": histogram_mean_ms(before["ttft"], after["ttft"]),
                              "tpot_mean_ms": histogram_mean_ms(before["tpot"], after["tpot"]),
                              "prefix_hit_tokens": after["prefix"][0] - before["prefix"][0]}
    print(f"http: {len(ok)} requests in {duration:.1f} s | {out['requests_per_s']:.2f} req/s | "
          f"{out['output_tokens_per_s']:.1f} output tok/s | TTFT p50 {out['ttft_ms']['p50']:.0f} ms "
          f"p99 {out['ttft_ms']['p99']:.0f} ms | TPOT mean {out['tpot_ms']['mean']:.1f} ms | "
          f"ITL p50 {out['itl_ms']['p50']:.1f} ms p99 {out['itl_ms']['p99']:.1f} ms | {len(errors)} errors"
          + (f" | goodput {out['goodput']['requests_per_s']:.2f} req/s ({100 * out['goodput']['fraction']:.0f}% "
             f"within {describe_slo(args.slo_ttft, args.slo_tpot)})" if with_slo else ""))
    if after is not None:
        print(f"server side: TTFT mean {out['server_side']['ttft_mean_ms']:.1f} ms, TPOT mean "
              f"{out['server_side']['tpot_mean_ms']:.1f} ms, {out['server_side']['prefix_hit_tokens']:.0f} "
              f"prefix-cache hit tokens (client: TTFT mean {out['ttft_ms']['mean']:.1f} ms, "
              f"TPOT mean {out['tpot_ms']['mean']:.1f} ms)")
    if errors:
        print(f"first error: {errors[0]!r}", file=sys.stderr)

    if args.bench_binary:
        if not args.bench_model:
            ap.error("--bench-binary needs --bench-model")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "bench.json")
            command = [args.bench_binary, "bench", "-m", args.bench_model, "--workload", "throughput",
                       "-n", str(args.num_prompts), "--mean-prompt-len", str(args.prompt_len),
                       "--mean-output-len", str(args.output_len), "--len-sigma", "0",
                       "--concurrency", str(args.concurrency), "--request-rate", str(args.request_rate),
                       "--slo-ttft", str(args.slo_ttft), "--slo-tpot", str(args.slo_tpot),
                       "--seed", str(args.seed), "--json", path, *args.bench_args]
            print("in-process: " + " ".join(command), file=sys.stderr)
            subprocess.run(command, check=True, stdout=sys.stderr)
            with open(path) as f:
                engine = json.load(f)
        out["engine"] = engine
        out["compare"] = {
            "throughput_ratio": out["output_tokens_per_s"] / engine["output_tokens_per_s"],
            "added_tpot_ms": out["tpot_ms"]["mean"] - engine["tpot_ms"]["mean"],
            "added_itl_p50_ms": out["itl_ms"]["p50"] - engine["itl_ms"]["p50"],
            "added_ttft_p50_ms": out["ttft_ms"]["p50"] - engine["ttft_ms"]["p50"],
        }
        c = out["compare"]
        print(f"engine: {engine['output_tokens_per_s']:.1f} output tok/s, TPOT mean {engine['tpot_ms']['mean']:.1f} ms, "
              f"TTFT p50 {engine['ttft_ms']['p50']:.0f} ms | http/engine throughput {c['throughput_ratio']:.3f}, "
              f"added per token {c['added_tpot_ms']:+.2f} ms (TPOT mean), {c['added_itl_p50_ms']:+.2f} ms (ITL p50), "
              f"added TTFT p50 {c['added_ttft_p50_ms']:+.1f} ms"
              + (f" | engine goodput {engine['goodput']['requests_per_s']:.2f} req/s "
                 f"({100 * engine['goodput']['fraction']:.0f}%)" if "goodput" in engine else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
