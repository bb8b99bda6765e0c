"""The engine sidecar: SGLang's, OpenAI's (vLLM) and llama.cpp's own HTTP APIs, with long prompts
compressed on the way to the engine. app.py (routes, the data path), formats.py (where the prompt
sits in each request format), prompt.py (context/query split), options.py (per-request options),
upstream.py (the upstream LLM server: its connection and health)."""
