"""Prometheus metrics of one service instance (its own registry: several may share a process)."""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Metrics:
    """requests by method, errors by code, queue depth, batch sizes, latencies, tokens in/out."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("ilre_requests", "Requests received, by method", ["method"], registry=registry)
        self.errors = Counter("ilre_errors", "Requests that failed, by status code", ["code"], registry=registry)
        self.queue_depth = Gauge("ilre_queue_depth", "Accepted requests not yet finished", registry=registry)
        self.batch_size = Histogram("ilre_batch_size", "Requests per processed batch", buckets=BATCH_BUCKETS,
                                    registry=registry)
        self.latency = Histogram("ilre_request_latency_seconds", "End-to-end request latency, by method",
                                 ["method"], buckets=LATENCY_BUCKETS, registry=registry)
        self.queue_wait = Histogram("ilre_queue_wait_seconds", "Time from acceptance to processing",
                                    buckets=LATENCY_BUCKETS, registry=registry)
        self.compute = Histogram("ilre_compress_seconds", "Engine time per request", buckets=LATENCY_BUCKETS,
                                 registry=registry)
        self.tokens_in = Counter("ilre_tokens_in", "Context tokens received", registry=registry)
        self.tokens_out = Counter("ilre_tokens_out", "Context tokens kept", registry=registry)
        self.tokens_resumed = Counter("ilre_tokens_resumed", "Context tokens whose prefill was taken on from the "
                                      "caller's cached encoding of a prefix (a grown context)", registry=registry)
        self.dropped = Counter("ilre_dropped", "Queued requests dropped (caller gone or deadline passed)",
                               registry=registry)
        self.redis_retries = Counter("ilre_redis_retries", "Redis calls that failed and were tried again, by what "
                                     "waited (result: a front end awaiting a result; finish: a worker writing "
                                     "one; cancel: a worker reading its requests' cancel markers, none taken as set)",
                                     ["call"], registry=registry)
        self.reclaimed = Counter("ilre_reclaimed", "Queue entries this worker took over from a worker silent past "
                                 "claim_idle_ms", registry=registry)
        self.own_pending_taken = Counter("ilre_own_pending_taken", "Queue entries this worker took back at once after "
                                         "a failed Redis call (a read whose reply was lost), not waiting for a reclaim",
                                         registry=registry)
        self.stale_dropped = Counter("ilre_stale_results_dropped", "Results this worker did not deliver because "
                                     "another worker had taken the entry over meanwhile", registry=registry)
        self.ready = Gauge("ilre_ready", "1 when requests can be served (model loaded / worker alive)",
                           registry=registry)
        # the engine sidecar
        self.sidecar_requests = Counter("ilre_sidecar_requests", "Sidecar requests on compressible routes, by route "
                                        "and action (compressed, passthrough, off, error)", ["route", "action"],
                                        registry=registry)
        self.sidecar_tokens = Counter("ilre_sidecar_prompt_tokens", "Prompt tokens of compressible requests, as "
                                      "received (original) and as forwarded", ["stage"], registry=registry)
        self.sidecar_passthrough = Counter("ilre_sidecar_passthrough", "Sidecar requests forwarded as they came, by "
                                           "reason (fits_budget, no_context, no_prompt, not_readable, other_tokenizer)",
                                           ["reason"], registry=registry)
        self.sidecar_retrieves = Counter("ilre_sidecar_retrieve_calls", "Calls of the retrieve tool the sidecar "
                                         "answered, by outcome (found, not_found, failed)", ["outcome"], registry=registry)
        self.sidecar_engine_latency = Histogram("ilre_sidecar_engine_seconds", "Time until the engine's response "
                                                "headers, by route", ["route"], buckets=LATENCY_BUCKETS, registry=registry)
        self.sidecar_engine_errors = Counter("ilre_sidecar_engine_errors", "Engine failures: unreachable, timeout, "
                                             "status_4xx, status_5xx", ["kind"], registry=registry)

        # the document cache of the engine this process serves (engine/documents.py), read when scraped
        self.documents: Any = None
        self.deepening: Any = None  # and its background deepening (engine/deepening.py)
        registry.register(_DocumentCacheCollector(self))

    def observe_result(self, timings_ms: dict[str, float], tokens_in: int, tokens_out: int, resumed: int = 0) -> None:
        """Record one finished compression."""
        if "queue" in timings_ms:
            self.queue_wait.observe(timings_ms["queue"] / 1000.0)
        if "total" in timings_ms:
            self.compute.observe(timings_ms["total"] / 1000.0)
        self.tokens_in.inc(tokens_in)
        self.tokens_out.inc(tokens_out)
        self.tokens_resumed.inc(resumed)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _DocumentCacheCollector:
    """Exposes a DocumentCache's counters at scrape time (nothing until an engine is loaded)."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # unchecked: the families appear once an engine's cache exists

    def collect(self) -> Iterator[Metric]:
        cache = self.metrics.documents
        if cache is None:
            return
        stats = cache.stats
        for name, counts, what in (("hits", stats.hits, "found"), ("misses", stats.misses, "did not find")):
            family = CounterMetricFamily(f"ilre_doc_cache_{name}", f"Document cache lookups that {what} the entry, "
                                         "by kind (ids, state; prefix: a cached encoding a longer context takes on) and tier (local, shared)", labels=["kind", "tier"])
            for (kind, tier), n in sorted(counts.items()):
                family.add_metric([kind, tier], n)
            yield family
        evictions = CounterMetricFamily("ilre_doc_cache_evictions", "Entries evicted to stay under the byte cap, by tier "
                                        "and cause (own: the writer's own, its owner over its share; pressure: "
                                        "another owner's)", labels=["tier", "cause"])
        tiers = [("local", stats.evicted)]
        if cache.shared is not None:
            tiers.append(("shared", getattr(cache.shared, "evicted", {})))
        for tier, evicted in tiers:
            for cause in ("own", "pressure"):
                evictions.add_metric([tier, cause], evicted.get(cause, 0))
        yield evictions
        documents = CounterMetricFamily("ilre_doc_cache_documents_evicted", "Documents whose IDs left this process's "
                                        "cache (their document_id then answers from the shared tier, or not at all), "
                                        "by cause", labels=["cause"])
        for cause in ("own", "pressure"):
            documents.add_metric([cause], stats.documents_evicted.get(cause, 0))
        yield documents
        pressure = CounterMetricFamily("ilre_doc_cache_pressure_evictions", "Entries of one owner (of: the tag of its "
                                       "key's share) evicted from this process's cache to make room for another's "
                                       "(by)", labels=["by", "of"])
        for (by, of), n in sorted(stats.pressure.items()):
            pressure.add_metric([by, of], n)
        yield pressure
        at_risk = getattr(cache.shared, "at_risk", None)
        if at_risk is not None:
            family = CounterMetricFamily("ilre_doc_cache_ids_at_risk", "Document IDs on the shared tier a failover "
                                         "could cost (unconfirmed: fewer replicas than redis_wait_replicas held the "
                                         "write in time) or that Redis failed for redis_retry_s (unstored, unread)",
                                         labels=["outcome"])
            for outcome in ("unconfirmed", "unstored", "unread"):
                family.add_metric([outcome], at_risk.get(outcome, 0))
            yield family
            yield CounterMetricFamily("ilre_doc_cache_shared_skipped", "Reads and writes of states and prefixes "
                                      "not sent to Redis: another call had failed within the outage window",
                                      value=getattr(cache.shared, "skipped", 0))
        yield GaugeMetricFamily("ilre_doc_cache_bytes", "Bytes held by the in-process document cache", value=stats.bytes)
        parts = GaugeMetricFamily("ilre_doc_cache_part_bytes", "Bytes held by the in-process document cache, by part "
                                  "(ids, units; of the encodings: keys, parts, windows, scores, stream, rows, resume)",
                                  labels=["part"])
        for part, held in cache.part_bytes().items():
            parts.add_metric([part], held)
        yield parts
        yield GaugeMetricFamily("ilre_doc_cache_documents", "Documents held by the in-process cache", value=stats.documents)
        deepening = self.metrics.deepening.stats if self.metrics.deepening is not None else None
        if deepening is not None:
            family = CounterMetricFamily("ilre_deepened_documents", "Documents encoded in full to l_R in the background, "
                                         "by outcome (finished; dropped: left the cache or the queue)", labels=["outcome"])
            family.add_metric(["finished"], deepening.finished)
            family.add_metric(["dropped"], deepening.dropped)
            yield family
            yield CounterMetricFamily("ilre_deepening_seconds", "Time spent deepening documents between requests",
                                      value=deepening.seconds)
