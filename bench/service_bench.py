"""`make bench` (second part): load on the service, in-process and through Redis.

N concurrent gRPC clients (one channel each) send M requests each: passkey haystacks of about
--tokens context tokens (as token IDs), budget --budget, on the embedded model. Every answer is
checked against the engine run directly; the table gives errors, wrong answers, throughput and
p50/p99 latency. Redis mode starts its own redis-server (temp dir, free loopback port) and
--workers `ilre worker` processes sharing the machine's cores.
Usage: bench/service_bench.py [--clients 32] [--requests 20] [--tokens 300] [--budget 64]
                              [--workers 2] [--modes local,redis]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import redis
import torch

from ilre.contract.messages import CompressRequest
from ilre.engine.engine import Engine
from ilre.evaluation.tasks.passkey import make_passkey_sample
from ilre.service.client import AsyncClient
from ilre.service.common.config import ServiceConfig
from ilre.service.server import ServiceThread

DISTINCT = 16


def requests_for(engine: Engine, tokens: int, budget: int) -> list[dict]:
    samples = [make_passkey_sample(engine.tokenizer, tokens, (i % 10) / 10, seed=i) for i in range(DISTINCT)]
    return [dict(context=s.context_ids, query=s.query_ids, budget=budget) for s in samples]


def comparable(result) -> dict:
    return {k: v for k, v in result.to_dict().items() if k not in ("timings_ms", "id")}


async def _load(target: str, requests: list[dict], clients: int, per_client: int) -> tuple[list, list, float]:
    async def one(n: int):
        out = []
        async with AsyncClient(target, timeout=900) as client:
            for k in range(per_client):
                i = (n + k) % len(requests)
                start = time.perf_counter()
                try:
                    result = await client.compress(**requests[i])
                except Exception as exc:
                    out.append((i, exc, time.perf_counter() - start))
                else:
                    out.append((i, result, time.perf_counter() - start))
        return out

    async with AsyncClient(target, timeout=900) as warm:
        await warm.compress(**requests[0])  # first-call initialisation out of the timing
    start = time.perf_counter()
    chunks = await asyncio.gather(*(one(n) for n in range(clients)))
    wall = time.perf_counter() - start
    outcomes = [item for chunk in chunks for item in chunk]
    return outcomes, [t for _, _, t in outcomes], wall


def report(name: str, outcomes: list, latencies: list[float], wall: float, wanted: list[dict]) -> str:
    errors = [o for _, o, _ in outcomes if isinstance(o, Exception)]
    wrong = sum(1 for i, o, _ in outcomes if not isinstance(o, Exception) and comparable(o) != wanted[i])
    ordered = sorted(latencies)
    p50 = ordered[len(ordered) // 2] * 1000
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000
    line = (f"{name:<22}{len(outcomes):>9}{len(errors):>8}{wrong:>7}{wall:>9.1f}{len(outcomes) / wall:>9.2f}"
            f"{p50:>10.0f}{p99:>10.0f}")
    if errors:
        line += f"   first error: {errors[0]}"
    return line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_redis(args, requests, wanted) -> str:
    binary = shutil.which("redis-server")  # `make bench` puts the venv's bin/ (deploy/test-tools.sh) on PATH
    if binary is None:
        return f"{'redis':<22}skipped: redis-server is not installed (`make tools` installs one)"
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", tmp, "--save", "",
                                   "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        threads = max(1, (os.cpu_count() or 1) // args.workers)
        workers = [subprocess.Popen([sys.executable, "-m", "ilre.cli", "worker", "--redis-url", url,
                                     "--name", f"bench-{n}", "--threads", str(threads), "--max-batch", "8"],
                                    stderr=subprocess.DEVNULL) for n in range(args.workers)]
        try:
            client = redis.Redis(port=port, decode_responses=True)
            give_up = time.monotonic() + 300
            while len(list(client.scan_iter("ilre:worker:*"))) < args.workers:
                if time.monotonic() > give_up or any(w.poll() is not None for w in workers):
                    return f"{'redis':<22}failed: workers did not start"
                time.sleep(0.2)
            config = ServiceConfig.from_env({}, host="127.0.0.1", grpc_port=0, http_port=0, redis_url=url,
                                            max_queue=max(256, args.clients * 2))
            with ServiceThread(config) as svc:
                outcomes, latencies, wall = asyncio.run(_load(f"127.0.0.1:{svc.grpc_port}", requests, args.clients,
                                                              args.requests))
            return report(f"redis ({args.workers} workers)", outcomes, latencies, wall, wanted)
        finally:
            for proc in (*workers, server):
                proc.send_signal(signal.SIGTERM)
            for proc in (*workers, server):
                proc.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=20, help="per client")
    parser.add_argument("--tokens", type=int, default=300, help="context tokens per request")
    parser.add_argument("--budget", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2, help="`ilre worker` processes in Redis mode")
    parser.add_argument("--modes", default="local,redis")
    args = parser.parse_args()
    engine = Engine()
    requests = requests_for(engine, args.tokens, args.budget)
    wanted = [comparable(engine.compress(CompressRequest(context_ids=r["context"], query_ids=r["query"],
                                                         budget=r["budget"]))) for r in requests]
    print(f"service load: {args.clients} clients x {args.requests} requests, {args.tokens}-token contexts, "
          f"budget {args.budget}, {engine.model_name} on CPU ({os.cpu_count()} cores, torch threads "
          f"{torch.get_num_threads()})")
    print(f"{'mode':<22}{'requests':>9}{'errors':>8}{'wrong':>7}{'wall s':>9}{'req/s':>9}{'p50 ms':>10}{'p99 ms':>10}")
    modes = args.modes.split(",")
    if "local" in modes:
        config = ServiceConfig.from_env({}, host="127.0.0.1", grpc_port=0, http_port=0,
                                        max_queue=max(256, args.clients * 2))
        with ServiceThread(config, engine) as svc:
            outcomes, latencies, wall = asyncio.run(_load(f"127.0.0.1:{svc.grpc_port}", requests, args.clients,
                                                          args.requests))
        print(report("in-process", outcomes, latencies, wall, wanted), flush=True)
    if "redis" in modes:
        del engine  # the workers hold their own
        print(run_redis(args, requests, wanted), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
