"""The tests' shorthands over the pipeline's one entry point (compressor/pipeline.select): a context and one or
several questions, or questions against a context already encoded, each a SelectionJob run by `select`."""

from __future__ import annotations

from typing import Callable

import torch

from ilre.compressor.context_state import ContextState
from ilre.compressor.pipeline import FreshEncodings, Selection, SelectionJob, select
from ilre.compressor.prefill_config import PrefillConfig
from ilre.compressor.strategies import Strategy
from ilre.compressor.units import Units
from ilre.models.llama import TruncatedLM


def select_context_queries(model: TruncatedLM | None, context_ids: torch.Tensor, queries_ids: list[torch.Tensor],
                           budget: int, strategy: Strategy, config: PrefillConfig,
                           units: Units | None = None) -> list[Selection]:
    """One selection per question of one context (L,), encoded here."""
    return select(model, SelectionJob(context_ids, queries_ids, budget, strategy, units), config)


def select_context(model: TruncatedLM | None, context_ids: torch.Tensor, query_ids: torch.Tensor, budget: int,
                   strategy: Strategy, config: PrefillConfig, units: Units | None = None) -> Selection:
    """The selection of one question (Lq,) of one context (L,), encoded here."""
    return select_context_queries(model, context_ids, [query_ids], budget, strategy, config, units)[0]


def select_queries(model: TruncatedLM, state: ContextState, queries_ids: list[torch.Tensor], budget: int,
                   strategy: Strategy, context_ids: torch.Tensor, units: Units | None = None,
                   deepened: Callable[[], ContextState] | None = None,
                   stream: torch.Tensor | None = None) -> list[Selection]:
    """The questions' selections against `state`, the context (L,) already encoded as `strategy` reads it
    (`stream`, `deepened`: as FreshEncodings takes them)."""
    encodings = FreshEncodings(model, context_ids, state.config, strategy, budget, len(queries_ids), encoded=state,
                               stream=stream, deepened=deepened)
    return select(model, SelectionJob(context_ids, queries_ids, budget, strategy, units, encodings), state.config)


def select_query(model: TruncatedLM, state: ContextState, query_ids: torch.Tensor, budget: int, strategy: Strategy,
                 context_ids: torch.Tensor, units: Units | None = None,
                 deepened: Callable[[], ContextState] | None = None, stream: torch.Tensor | None = None) -> Selection:
    """`select_queries` for one question."""
    return select_queries(model, state, [query_ids], budget, strategy, context_ids, units, deepened, stream)[0]
