"""The engine sidecar: SGLang's, OpenAI's (vLLM) and llama.cpp's own HTTP APIs, with long prompts
compressed on the way to the engine. app.py (routes, the data path), formats.py (where the prompt
sits in each request format), prompt.py (a plain prompt's context/query split), options.py (per-request
options), plan.py (what is forwarded and what the answer's headers say), history.py (the texts sent for
each message, history mode frozen), retrieve.py and tool_dialects.py (the retrieve tool answered by the
sidecar, in each API's words), upstream.py (the upstream LLM server: its connection and health).
Conversations are read by contract/conversation.py and compressed by service/transport/chat_compression.py,
as the gateway's are."""
