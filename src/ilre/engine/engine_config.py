"""What an Engine is built from: the model, its placement, the prefill and the limits of one request."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..compressor.prefill_config import PrefillConfig
from ..contract.defaults import DEFAULT_BUDGET, DOC_CACHE_MB, DOC_CACHE_SHARE, MAX_CONTEXT_TOKENS, MAX_QUERY_TOKENS
from ..contract.settings import declared
from .engine_settings import EngineSettings


@dataclass(frozen=True)
class EngineConfig:
    """model: reference (folder, .gguf, hub id; None = embedded default); layer: l_R override
    (None = the model's profile); device/dtype: see models/device.py ("auto" = the fastest that
    keeps the selections); prefill: S/W/chunk; limits on what one request may carry; doc_cache_mb:
    the in-process tier of the document cache (engine/documents.py); batch_tokens:
    how many padded context tokens short requests may share one batched prefill with (None =
    16384 on GPUs and NPUs, 0 = off on CPUs, where `make bench` measured no gain: the 2 cores are
    as busy with one 300-token request as with 32 of them, and a batch only delays its first ones).
    The bounds are EngineSettings' (engine/engine_settings.py): ValueError naming the setting."""

    model: str | None = None
    layer: int | str | None = None
    decoder: str = "auto"  # the layers that run the model: auto, fast or transformers (models/loader.spec_from_config)
    device: str = "auto"
    dtype: str = "auto"
    prefill: PrefillConfig = field(default_factory=PrefillConfig)
    max_context_tokens: int = MAX_CONTEXT_TOKENS
    max_request_tokens: int = MAX_CONTEXT_TOKENS  # context tokens one request may name in all (its document_ids)
    max_query_tokens: int = MAX_QUERY_TOKENS
    default_budget: int = DEFAULT_BUDGET
    batch_tokens: int | None = None  # padded context tokens per batched prefill; 0 = off, None = auto
    doc_cache_mb: int = DOC_CACHE_MB  # in-process document cache (IDs and encoded contexts); 0 = off
    doc_cache_share: float = DOC_CACHE_SHARE  # of each tier's cap, held for each caller's scope (engine/documents.py)
    deepen: bool = False  # encode asked documents in full to l_R while idle (engine/deepening.py; the service's default)
    hold_streams: bool = False  # without deepening, still hold asked documents' streams (engine/encodings.py; batch's)
    resume: bool = True  # a context that extends a cached one takes its encoding on (engine/encodings.py)

    def __post_init__(self) -> None:
        for s in declared(EngineSettings):
            if hasattr(self, s.name):
                s.check(getattr(self, s.name))

    @classmethod
    def from_settings(cls, settings: EngineSettings) -> "EngineConfig":
        """The config the settings describe (a bad sink/window/chunk raises PrefillConfig's ValueError)."""
        return cls(model=settings.model, layer=settings.layer, decoder=settings.decoder, device=settings.device,
                   dtype=settings.dtype,
                   prefill=PrefillConfig(settings.sink, settings.window or None, settings.chunk),
                   max_context_tokens=settings.max_context_tokens, max_request_tokens=settings.max_request_tokens,
                   batch_tokens=settings.batch_tokens,
                   doc_cache_mb=settings.doc_cache_mb, doc_cache_share=settings.doc_cache_share, deepen=settings.deepen == "idle",
                   hold_streams=settings.deepen == "hold", resume=settings.resume == "on")
