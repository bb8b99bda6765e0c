"""Where users already are: LangChain's document compressor and LlamaIndex's node postprocessor (each
retrieved document compressed for the query), LLMLingua's `PromptCompressor` (its call and answer), and a
LiteLLM proxy hook (every model behind a gateway gets compressed prompts). All run against a service
(gRPC or HTTP, the thin client) or in process (`backend.py`)."""
