"""LLMLingua's `PromptCompressor`, answered by ilre: switching is the import line.

    from ilre.integrations.llmlingua import PromptCompressor   # was: from llmlingua import PromptCompressor
    compressor = PromptCompressor()                              # the embedded model, in process
    compressor = PromptCompressor(target="127.0.0.1:50051")      # or a running ilre (gRPC, or http://...)
    result = compressor.compress_prompt(context, instruction="", question="...", target_token=200)
    result["compressed_prompt"], result["origin_tokens"], result["ratio"]     # '11.2x', as LLMLingua writes it

How LLMLingua's arguments map:
- `context` (a string or a list of strings, joined by blank lines as LLMLingua joins them) is the document
  ILRe compresses; `question` is its query, and when there is none the instruction is (ILRe ranks context
  tokens by the query's attention, so a question gives the best selection); the instruction and the
  question are kept whole, and the compressed prompt is "instruction\\n\\ncompressed context\\n\\nquestion"
  as LLMLingua builds it (`concate_question=False` leaves the question out).
- `target_token` is the budget of context tokens; otherwise `rate` sets it as LLMLingua does:
  rate x (instruction + context + question tokens) - instruction - question.
- `rank_method` ("llmlingua" / "longllmlingua"), `condition_in_question` and `condition_compare` choose
  LLMLingua's question-aware ranking: ILRe's ranking is always the question's attention, so every value
  LLMLingua accepts is accepted (and "longllmlingua" needs a question, as there).
- `use_sentence_level_filter=True` keeps whole sentences: ilre's `granularity="unit"` (whole sentences,
  lines, records; only the sink's first tokens and one unit cut to fill the budget exactly are partial),
  as does `use_token_level_filter=False`. `granularity=` may also be given directly, to the constructor or
  to the call.
- LongLLMLingua's context options work on whole units: `reorder_context="sort"` (the contexts the question
  attends to most first), `dynamic_context_compression_ratio` (the budget re-shared by that rank),
  `force_context_ids` (contexts kept whole); `force_tokens` of line breaks and sentence or clause marks is
  what whole units keep (UNIT_MARKS).
- Token counts are the model's own tokens (LLMLingua counts GPT-3.5's), summed over instruction, context
  and question; `ratio`, `rate` and `saving` are formatted exactly as LLMLingua formats them.
- Options that only tune LLMLingua's own passes (`INTERNAL_OPTIONS`) are accepted with any value and a
  warning, once per process. Every other option is accepted at its default value; any other value raises
  ValueError naming the option and what to do instead (`OPTIONS_WITHOUT_MAPPING`).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from ..contract.messages import GRANULARITIES
from .backend import Backend, chosen, compress_by_its_end, count_tokens

# LLMLingua's options that tune only its own passes: any value is accepted and changes nothing (a warning, once)
INTERNAL_OPTIONS = {
    "iterative_size": "the segment size of LLMLingua's iterative token pass; ILRe scores the context in one pass",
    "token_budget_ratio": "the room LLMLingua's sentence pass leaves its token pass; ilre meets the budget in one selection",
    "context_budget": "the slack of LLMLingua's context pass; ilre's budget is target_token or rate",
    "high_priority_bonus": "LLMLingua's bonus for forced contexts; force_context_ids keeps them whole here",
    "chunk_end_tokens": "where LLMLingua-2 cuts its chunks; ILRe reads the whole context at once",
    "add_instruction": "an instruction LongLLMLingua adds to its own ranking prompt",
    "word_sep": "only read with return_word_label=True", "label_sep": "only read with return_word_label=True",
    "token_to_word": "only read with return_word_label=True",
}
# LLMLingua's options ilre has no counterpart for: their default values, and what to do instead of another value
OPTIONS_WITHOUT_MAPPING: dict[str, tuple[Any, str]] = {
    "force_context_number": (None, "ilre ranks the contexts by the question's attention and keeps what the budget "
                                   "holds; drop the option"),
    "use_context_level_filter": (True, "ILRe's allocation spans every context at once; drop the option"),
    "keep_split": (False, "ilre keeps no separators on purpose; drop the option"),
    "keep_first_sentence": (0, "put the sentences to keep in the instruction"),
    "keep_last_sentence": (0, "put the sentences to keep in the question"),
    "keep_sentence_number": (0, "ILRe keeps the sentences the question attends to and cannot force a number of them "
                                "in; drop the option (use_sentence_level_filter=True keeps whole sentences)"),
    "context_segs": (None, "structured compression is not offered: compress each segment with its own call"),
    "context_segs_rate": (None, "structured compression is not offered: compress each segment with its own call"),
    "context_segs_compress": (None, "structured compression is not offered: compress each segment with its own call"),
    "target_context": (-1, "set target_token (context tokens)"),
    "context_level_rate": (1.0, "set rate or target_token"),
    "context_level_target_token": (-1, "set rate or target_token"),
    "force_reserve_digit": (False, "drop the option"),
    "drop_consecutive": (False, "drop the option"),
    "return_word_label": (False, "read kept tokens from ilre's own API (kept_indices)"),
}
UNIT_MARKS = ("\n", ".", "!", "?", ",", ";", ":")  # force_tokens whole units keep: each unit carries its own end
REORDERS = ("original", "sort")
RANK_TOKENS = 64  # the least budget of the selection that ranks contexts (1/16 of the budget): where attention peaks
_warned: set[str] = set()
RANK_METHODS = ("llmlingua", "longllmlingua")
CONDITIONS = ("none", "before", "after")


class PromptCompressor:
    """LLMLingua's class, backed by ilre. model_name: the model ILRe runs (a checkpoint folder, .gguf or hub
    id; None = the embedded default; in process only); target: None = in process, "HOST:PORT" = an ilre
    service's gRPC API, "http(s)://HOST:PORT" its HTTP API; strategy: an ilre strategy (None: the default);
    granularity: "token" or "unit" (whole sentences, lines, records; None: the default). LLMLingua's
    `device_map`, `model_config`, `open_api_config`, `use_llmlingua2` and `llmlingua2_config` are accepted at
    their defaults (device_map also as "cpu"/"cuda"/"auto", where ilre places the model itself)."""

    def __init__(self, model_name: str | None = None, device_map: str = "cuda", model_config: dict | None = None,
                 open_api_config: dict | None = None, use_llmlingua2: bool = False,
                 llmlingua2_config: dict | None = None, *, target: str | None = None, api_key: str | None = None,
                 strategy: str | None = None, timeout_s: float = 300.0, granularity: str | None = None):
        if model_name is not None and ("llmlingua-2" in model_name or use_llmlingua2):
            raise ValueError(f"model_name: {model_name} is an LLMLingua-2 token classifier; ilre ranks with the "
                             "downstream model's own layers: leave model_name out (the embedded model) or name a "
                             "Llama-architecture model (folder, .gguf or hub id)")
        if model_name is not None and target is not None:
            raise ValueError("model_name: a remote ilre (target) runs its own model: give one of model_name, target")
        for name, value in (("model_config", model_config), ("open_api_config", open_api_config),
                            ("llmlingua2_config", llmlingua2_config)):
            if value:
                raise ValueError(f"{name}: ilre loads and places its model itself; drop the option")
        if not isinstance(device_map, str) or device_map.split(":")[0] not in ("cuda", "cpu", "auto", "npu", "mps"):
            raise ValueError(f"device_map: must name a device such as cuda or cpu (got {device_map!r})")
        self.backend = Backend(target, api_key, timeout_s, model=model_name)
        self.strategy, self.granularity = strategy, _checked_granularity(granularity)

    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self.compress_prompt(*args, **kwargs)

    def compress_prompt(self, context: str | list[str], instruction: str = "", question: str = "",
                        rate: float = 0.5, target_token: float = -1, rank_method: str = "llmlingua",
                        condition_in_question: str = "none", condition_compare: bool = False,
                        concate_question: bool = True, use_sentence_level_filter: bool = False,
                        use_token_level_filter: bool = True, granularity: str | None = None,
                        reorder_context: str = "original", dynamic_context_compression_ratio: float = 0.0,
                        force_context_ids: list[int] | None = None, force_tokens: list[str] | None = None,
                        **options: Any) -> dict[str, Any]:
        """LLMLingua's call and answer: {"compressed_prompt", "origin_tokens", "compressed_tokens", "ratio",
        "rate", "saving"} (see the module docstring for how each argument maps)."""
        _check_options(options)
        grain = self._granularity(use_sentence_level_filter, use_token_level_filter, granularity)
        contexts = [context] if isinstance(context, str) else list(context or [])
        if not all(isinstance(c, str) for c in contexts):
            raise ValueError("context: must be a string or a list of strings")
        per_context = _per_context_options(reorder_context, dynamic_context_compression_ratio, force_context_ids,
                                           len(contexts))
        if force_tokens or per_context:
            grain = _needs_units(grain, "force_tokens" if force_tokens else per_context)
        _check_force_tokens(force_tokens)
        if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not 0 < rate <= 1:
            raise ValueError(f"rate: must be a number in (0, 1] (got {rate!r})")
        if rank_method not in RANK_METHODS:
            raise ValueError(f"rank_method: must be one of {', '.join(RANK_METHODS)} (got {rank_method!r})")
        if condition_in_question.removesuffix("_condition") not in CONDITIONS:
            raise ValueError(f"condition_in_question: must be one of {', '.join(CONDITIONS)}, optionally with "
                             f"_condition (got {condition_in_question!r})")
        if rank_method == "longllmlingua" and not question:
            raise ValueError("question: LongLLMLingua's ranking (rank_method='longllmlingua') needs a question")
        document = "\n\n".join(c for c in contexts if c.strip())
        query = question or instruction
        if document and not query.strip():  # no question: the prompt's own end is the query (the sidecar's rule)
            return self._compress_by_its_end(document, rate, target_token, grain)
        instruction_tokens = self._count(instruction) if question else None
        if not document:
            question_tokens = self._count(question)
            return _answer(instruction, "", question, concate_question, 0, 0, instruction_tokens or
                           self._count(instruction), question_tokens)
        whole = self._send(document, query, grain, ratio=1.0)  # the counts (nothing is computed)
        length, asked = whole.original_tokens, len(whole.token_ids) - whole.compressed_tokens
        if target_token is not None and target_token != -1:
            budget = max(1, int(target_token))
        else:  # LLMLingua's rule: rate of the whole prompt, less the parts kept whole
            kept_whole = (instruction_tokens if question else asked) + (asked if question and concate_question else 0)
            budget = max(1, math.floor((length + asked + (instruction_tokens or 0)) * rate - kept_whole))
        if per_context:
            kept_text, kept = self._by_context(contexts, query, budget, reorder_context, dynamic_context_compression_ratio,
                                               force_context_ids or [])
        elif budget < length:
            result = self._send(document, query, grain, budget=budget)
            kept_text, kept = result.compressed_context, result.compressed_tokens
        else:
            kept_text, kept = whole.compressed_context, length
        return _answer(instruction, kept_text, question, concate_question, length, kept,
                       instruction_tokens if question else asked, asked if question else 0)

    def _by_context(self, contexts: list[str], query: str, budget: int, reorder: str, dynamic: float,
                    forced: list[int]) -> tuple[str, int]:
        """LongLLMLingua's context options over a unit selection of the contexts that are not forced.
        A context's relevance is its share of a selection at 1/16 of the budget (at least RANK_TOKENS),
        where the question's attention peaks (at the full budget Algorithm 1 spreads over every context).
        Forced contexts are kept whole within the budget; `dynamic` re-shares the rest by rank and
        compresses each context on its own, else one selection over them all keeps the budget; "sort"
        puts the forced, then the most relevant first. Contexts with nothing kept are dropped, as
        LLMLingua's context filter drops them. -> (text, kept tokens)."""
        held = {i: self._count(contexts[i]) for i in dict.fromkeys(forced)}
        free = [i for i, c in enumerate(contexts) if i not in held and c.strip()]
        room = max(1, budget - sum(held.values()))
        pieces: dict[int, str] = {i: contexts[i] for i in held}
        kept = sum(held.values())
        share: dict[int, int] = {}
        if free:
            texts = [contexts[i] for i in free]
            peaks, _ = self._kept_by_context(texts, query, min(room, max(RANK_TOKENS, room // 16)))
            share = {i: sum(e - b for b, e in spans) for i, spans in zip(free, peaks)}
            if dynamic and len(free) > 1:
                rank = {i: r for r, i in enumerate(sorted(free, key=lambda i: -share[i]))}
                weight = {i: share[i] * (1 + dynamic * (1 - 2 * rank[i] / (len(free) - 1))) for i in free}
                total = sum(weight.values()) or 1.0
                for i in free:
                    size = math.floor(room * weight[i] / total)
                    one = self._send(contexts[i], query, "unit", budget=size) if size > 0 else None
                    pieces[i] = one.compressed_context if one else ""
                    kept += one.compressed_tokens if one else 0
            else:
                spans_of, result = self._kept_by_context(texts, query, room)
                pieces.update({i: "".join(contexts[i][b:e] for b, e in spans) for i, spans in zip(free, spans_of)})
                kept += result.compressed_tokens
        order = [i for i in range(len(contexts)) if i in pieces]
        if reorder == "sort":
            order = list(held) + sorted(free, key=lambda i: (-share[i], i))
        return "\n\n".join(pieces[i] for i in order if pieces[i].strip()), kept

    def _kept_by_context(self, texts: list[str], query: str, budget: int):
        """One unit selection over the texts joined by blank lines -> ([[start, end), ...] kept characters of each
        text, the result)."""
        document = "\n\n".join(texts)
        result = self._send(document, query, "unit", budget=budget)
        spans = result.kept_spans if result.kept_spans is not None else [[0, len(document)]]
        starts, out = [], []
        at = 0
        for text in texts:
            starts.append(at)
            at += len(text) + 2
        for start, text in zip(starts, texts):
            end = start + len(text)
            out.append([[max(b, start) - start, min(e, end) - start] for b, e in spans if b < end and e > start])
        return out, result

    def _granularity(self, sentences: bool, tokens: bool, granularity: str | None) -> str | None:
        """The granularity of one call: `granularity`, else "unit" for LLMLingua's sentence-level filter,
        else the constructor's; ValueError for a combination ilre has no counterpart for."""
        given = _checked_granularity(granularity)
        if sentences and given == "token":  # the flags are read as LLMLingua reads them: by their truth
            raise ValueError("use_sentence_level_filter: True keeps whole sentences, granularity='token' single "
                             "tokens: give one of them")
        chosen_granularity = given or ("unit" if sentences or not tokens else self.granularity)
        if not tokens and chosen_granularity != "unit":
            raise ValueError("use_token_level_filter: False keeps whole sentences or whole contexts; ilre keeps whole "
                             "sentences with use_sentence_level_filter=True (granularity='unit'), whole contexts alone "
                             "it does not offer")
        return chosen_granularity

    def _compress_by_its_end(self, document: str, rate: float, target_token: float,
                             granularity: str | None) -> dict[str, Any]:
        """A prompt without question or instruction: its end is the query (backend.compress_by_its_end);
        `rate` or `target_token` cover the whole prompt."""
        length, ids = count_tokens(self.backend, document)
        target = int(target_token) if target_token is not None and target_token != -1 else math.floor(length * rate)
        short = compress_by_its_end(self.backend, document, target, self.strategy, ids, granularity)
        return _answer("", short.text, "", False, short.original_tokens, short.kept_tokens, 0, 0)

    def _send(self, document: str, query: str, granularity: str | None, budget: int | None = None,
              ratio: float | None = None):
        fields: dict[str, Any] = {"context": document, "query": query, **chosen(self.strategy, granularity)}
        fields.update({"budget": budget} if budget is not None else {"ratio": ratio})
        return self.backend.compress(**fields)

    def _count(self, text: str) -> int:
        """Tokens of `text` in the model's tokenizer (0 for none)."""
        return count_tokens(self.backend, text)[0] if text else 0


def _checked_granularity(granularity: Any) -> str | None:
    """`granularity` if None or one ilre offers, else ValueError naming it."""
    if granularity is not None and granularity not in GRANULARITIES:
        raise ValueError(f"granularity: must be one of {', '.join(GRANULARITIES)} (got {granularity!r})")
    return granularity


def _per_context_options(reorder: Any, dynamic: Any, forced: Any, count: int) -> str | None:
    """The first of LongLLMLingua's context options that asks for work per context (None: none does);
    ValueError naming an option whose value ilre does not offer."""
    if reorder not in REORDERS:
        raise ValueError(f"reorder_context: must be one of {', '.join(REORDERS)} (got {reorder!r}); "
                         "two_stage is not offered")
    if isinstance(dynamic, bool) or not isinstance(dynamic, (int, float)) or not 0 <= dynamic <= 1:
        raise ValueError(f"dynamic_context_compression_ratio: must be a number in [0, 1] (got {dynamic!r})")
    if forced is not None and (not isinstance(forced, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < count for i in forced)):
        raise ValueError(f"force_context_ids: must be a list of context indices in 0..{count - 1} (got {forced!r})")
    for name, on in (("reorder_context", reorder != "original"), ("dynamic_context_compression_ratio", dynamic),
                     ("force_context_ids", forced)):
        if on:
            return name
    return None


def _needs_units(granularity: str | None, option: str) -> str:
    """"unit" for an option that reads or keeps whole units; ValueError naming it against granularity='token'."""
    if granularity == "token":
        raise ValueError(f"{option}: works on whole units (sentences, lines), and granularity='token' keeps single "
                         "tokens: drop one of them")
    return "unit"


def _check_force_tokens(tokens: Any) -> None:
    """force_tokens LLMLingua-2's README uses (line breaks, sentence and clause marks) are kept by whole units,
    each of which carries its own end; any other token raises."""
    if tokens is None:
        return
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ValueError(f"force_tokens: must be a list of strings (got {tokens!r})")
    other = [t for t in tokens if t not in UNIT_MARKS]
    if other:
        raise ValueError(f"force_tokens: ILRe keeps the tokens the question attends to and cannot force {other[0]!r} "
                         f"in; whole units keep their own ends ({' '.join(repr(m) for m in UNIT_MARKS)}), nothing else "
                         "is forced")


def _check_options(options: dict[str, Any]) -> None:
    for name, value in options.items():
        if name in INTERNAL_OPTIONS:
            if name not in _warned:
                _warned.add(name)
                warnings.warn(f"{name}: accepted and without effect in ilre ({INTERNAL_OPTIONS[name]})", stacklevel=3)
            continue
        if name not in OPTIONS_WITHOUT_MAPPING:
            raise TypeError(f"compress_prompt() got an unexpected keyword argument {name!r}")
        default, instead = OPTIONS_WITHOUT_MAPPING[name]
        if value != default:
            raise ValueError(f"{name}: LLMLingua's option has no counterpart in ilre (got {value!r}, only its "
                             f"default {default!r} is accepted): {instead}")


def _answer(instruction: str, kept: str, question: str, with_question: bool, length: int, kept_tokens: int,
            instruction_tokens: int, question_tokens: int) -> dict[str, Any]:
    """LLMLingua's answer: the parts joined by blank lines, counts and LLMLingua's formatted figures."""
    shown = question if with_question else ""
    prompt = "\n\n".join(part for part in (instruction, kept, shown) if part.strip())
    origin = instruction_tokens + length + question_tokens
    compressed = instruction_tokens + kept_tokens + (question_tokens if shown else 0)
    ratio = 1 if compressed == 0 else origin / compressed
    saving = (origin - compressed) * 0.06 / 1000  # LLMLingua's GPT-4 price per 1K tokens, as it reports it
    return {"compressed_prompt": prompt, "origin_tokens": origin, "compressed_tokens": compressed,
            "ratio": f"{ratio:.1f}x", "rate": f"{100 / ratio:.1f}%", "saving": f", Saving ${saving:.1f} in GPT-4."}
