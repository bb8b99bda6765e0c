"""The settings every command that loads the model shares (compress, batch, demo, serve, sidecar, worker):
the engine's own (model, placement, prefill, limits, caches) and the defaults of requests that leave a
field out. Declared once here (contract/settings.py); importable without torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..compressor.defaults import CHUNK, SINK, WINDOW
from ..contract.defaults import (AUTO_BATCH_TOKENS, DEFAULT_BUDGET, DEFAULT_STRATEGY, DOC_CACHE_MB, DOC_CACHE_SHARE,
                                 MAX_CONTEXT_TOKENS)
from ..contract.messages import DCA_MODES, GRANULARITIES
from ..contract.settings import SERVERS, check_settings, setting
from ..models.placement_names import DEVICE_HELP, DTYPE_CHOICES

DEEPEN_MODES = ("idle", "hold", "off")
DECODERS = ("auto", "fast", "transformers")


def layer_value(text: str) -> int | str:
    """A layer number, or a name of the profile's choices (checked when the model is loaded)."""
    return int(text) if text.strip().lstrip("-").isdigit() else text.strip()


@dataclass(frozen=True)
class EngineSettings:
    """The model-loading commands' settings; `EngineConfig.from_settings` and `request_defaults()` hand them on."""

    model: str | None = setting(None, "checkpoint folder, .gguf file or hub id", shown_default="embedded "
                                "SmolLM2-135M-Instruct")
    layer: int | str | None = setting(None, "retrieval layer l_R: a number or a name the model's profile offers "
                                      "(fast, default, robust)", parse=layer_value, shown_default="the profile's")
    strategy: str | None = setting(None, "the strategy of requests that name none: cascade, ilre, snapkv, "
                                   "streaming_llm, lagkv, reattention, locret, actqkv", shown_default=DEFAULT_STRATEGY)
    strategy_options: str | None = setting(None, 'the strategy\'s options as a JSON object, e.g. {"lag": 256} for '
                                           "lagkv", metavar="JSON")
    budget: int | None = setting(None, "context tokens to keep, sink included, of requests that give neither budget "
                                 "nor ratio", parse=int, exclusive="budget", shown_default=str(DEFAULT_BUDGET))
    ratio: float | None = setting(None, "share of the context tokens to keep, in (0, 1], of requests that give "
                                  "neither", parse=float, exclusive="budget")
    dca: str | None = setting(None, "dual chunk attention: auto = on beyond the model's native window",
                              choices=DCA_MODES, shown_default="auto", advanced=True)
    granularity: str | None = setting(None, "keep single tokens, or whole units: sentences, lines, JSON records, "
                                      "messages", choices=GRANULARITIES,
                                      shown_default="the profile's, token where it names none")
    decoder: str = setting("auto", "the layers that run the model: fast = the hand-tuned Llama decoder (llama, mistral, "
                           "qwen2, qwen3 with full attention in every layer: C kernels, int8, packed bfloat16), "
                           "transformers = the family's own transformers layers (any decoder family), auto = fast "
                           "where it applies", choices=DECODERS, advanced=True)
    device: str = setting("auto", f"{DEVICE_HELP}: where the model runs (auto: a GPU or NPU when present)")
    dtype: str = setting("auto", f"{', '.join(DTYPE_CHOICES)} (auto: bfloat16 on GPUs, NPUs and CPUs with native "
                         "bfloat16, int8 on other x86 CPUs, else float32; int8: CPUs only, the linear layers in int8)")
    sink: int = setting(SINK, "S sink tokens, always attended", minimum=0, advanced=True)
    window: int = setting(WINDOW, "W sliding-window tokens below l_R (0 = unbounded)", minimum=0, advanced=True)
    chunk: int = setting(CHUNK, "prefill chunk length", minimum=1, advanced=True)
    max_context_tokens: int = setting(MAX_CONTEXT_TOKENS, "reject longer contexts (tokens)", minimum=1)
    max_request_tokens: int = setting(MAX_CONTEXT_TOKENS, "reject requests naming more context tokens in all (the "
                                      "documents of document_ids)", minimum=1, advanced=True)
    doc_cache_mb: int = setting(DOC_CACHE_MB, "in-process document cache: token IDs and encoded contexts reused by "
                                "later queries of a document, in MiB (0 = off)", minimum=0)
    doc_cache_share: float = setting(DOC_CACHE_SHARE, "share of each document cache tier's cap held for each API key "
                                     "(or share= group): a key within it is never evicted by another key's traffic; "
                                     "a key over it gives up its own oldest documents first", above=0, maximum=1,
                                     advanced=True)
    batch_tokens: int | None = setting(None, "short requests of a queue batch share one prefill, up to this many "
                                       "padded context tokens (0 = off)", SERVERS, parse=int, minimum=0,
                                       shown_default=f"{AUTO_BATCH_TOKENS} on GPUs and NPUs, 0 on CPUs",
                                       advanced=True)
    deepen: str = setting("off", "idle: while no request waits, encode each asked document in full to l_R (its later "
                          "queries skip the candidate pass), and hold its residual stream until then; hold: deepen "
                          "none, hold each asked document's stream; a later query or a grown context starts its "
                          "candidates from a held stream; off: neither, every question selects what a fresh engine "
                          "would", (*SERVERS, "batch"), choices=DEEPEN_MODES,
                          default_for=(("serve", "idle"), ("worker", "idle"), ("sidecar", "idle"), ("batch", "hold")))
    resume: str = setting("on", "on: a context that extends one the caller sent before (a chat one turn longer, an "
                          "appended tool result) takes its cached encoding on, the new chunks only; each cached "
                          "encoding then also keeps its window caches as they stood before a last chunk cut short. "
                          "off: every new context is encoded whole", choices=("on", "off"), advanced=True)

    def __post_init__(self) -> None:
        check_settings(self)

    def request_defaults(self) -> dict[str, Any]:
        """The request fields given as settings: defaults of requests that leave them out (JSON options as text)."""
        return {"budget": self.budget, "ratio": self.ratio, "strategy": self.strategy, "dca": self.dca,
                "strategy_options": self.strategy_options, "granularity": self.granularity}

