"""The service's core, below every transport: request and result messages, error codes, the
Engine (a loaded model that compresses), what a running engine serves, and API keys."""
