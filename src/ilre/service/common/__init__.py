"""The service's ground floor, read by every floor above it and importing none of them: configuration,
errors and their statuses, API keys and quotas, metrics, tracing, the request log, Redis/Sentinel clients."""
