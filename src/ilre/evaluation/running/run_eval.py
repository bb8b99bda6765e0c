"""`ilre eval`: RULER-style tasks x lengths x strategies at one budget; retention and end to end.

For each (task, length, sample) the prompt is generated once and every strategy sees the same
context, query and budget:

  full            no compression: the whole prompt goes to the model (retention 100% by construction)
  cascade         the default: ILRe at l_R over candidates the profile's coarse layer picks
  cascade_units   the default keeping whole units (sentences, lines, records: `granularity` "unit")
  cascade_candidates  the default without its fallback (`deepen_below` 0: l_R ranks the candidates however
                  weakly it attends to them; evaluation/report/fallback.py replays the threshold with it)
  ilre            ILRe as the engine runs it (`--dca auto`: DCA on beyond the native window)
  ilre_units      ILRe keeping whole units
  cascade_units_nl  cascade_units with a line break between kept units that are not adjacent (in the reader's
                  prompt only: the kept tokens are the same; measures whether a separator helps the reader)
  ilre_nodca      ILRe with DCA off
  ilre_fast_too   ILRe scoring with layer 8's attention beside l_R's at equal weight (`also_layers`, `also_weight` 1)
  ilre_fast_half  the same with layer 8's attention at half weight (`also_layers` alone: `also_weight` 0.5 is its default)
  snapkv          the same layer-l_R attention (DCA auto, as the engine runs it), one kernel, plain top-k
  lagkv           LagKV: the layer-l_R K/V against the next partition's range, no query (DCA auto)
  reattention     ReAttention: pre-RoPE q.k votes and spans at l_R (DCA auto)
  locret          Locret: the shipped retaining head's scores at l_R, chunked eviction, no query (DCA auto)
  actqkv          ActQKV: cosine to the activation-aware probe query, 32-token chunks (DCA auto)
  actqkv_auto     ActQKV with its entropy-sized budget (at most the plan's budget; kept_tokens says how many)
  streaming_llm   sink + most recent tokens
  rag             BM25 over 256-token chunks, best chunks up to the budget, original order
  llmlingua       LLMLingua (coarse + token level), `llmlingua` 0.2.2 in its own environment
  longllmlingua   LongLLMLingua (question-aware), same package

Every row that runs in the engine (the attention rows and streaming_llm) goes through the engine's own
stages, exactly as a request does: `Engine.prepare` (layer, profile options, DCA `auto`, units),
`Engine.encode` (the document cache: rows reading the same encoding share one pass, e.g. the three
cascade rows, or ilre and snapkv) and `Engine.answer`. A row's compress_s is its encoding's pass (the
first row that ran it timed it) plus its own selection; a cascade row that fell back is also charged the
whole context's pass to l_R, which the first row that fell back timed (the others read what it left).

Metrics: retention = share of gold answers whose text is in the detokenized kept context;
end to end = the whole embedded model (all layers) generates greedily from
[chat head + kept context + question + chat tail + answer prefix], scored with RULER's
string_match_all (string_match_part for QA-like tasks).

Raw records go to `<results_dir>/raw.jsonl` (one line per sample x strategy; a rerun skips what is
there), the plan and notes to `<results_dir>/meta.json`; evaluation/report/page.py writes the page.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ...compressor.strategies import Strategy, make_strategy
from ...contract.messages import CompressRequest
from ..tasks.lengths import length_label
from ..tasks.ruler import RulerSample, TASKS, generate_sample
from ..tasks.structured import BUILDERS as STRUCTURED
from .baselines import rag_select
from .generation import Generator, new_token_budget
from .lingua import METHODS as LINGUA_METHODS
from .metrics import headed_share, retention, score, separated, whole_share
from .plan import ATTENTION, EvalPlan
from .plan_notes import caps_notes, plan_caps, widest_caps
from .records import Record, load_records, run_timing

log = logging.getLogger(__name__)

GUESSLESS = ("niah", "vt", *STRUCTURED)  # task kinds whose answers (random numbers, UUIDs, names) no reader guesses
UNIT_ROWS = ("cascade_units", "cascade_units_nl", "ilre_units")  # rows keeping whole units (compressor/units.py)
SEPARATORS = {"cascade_units_nl": "\n"}  # rows whose reader sees this text between kept runs that are not adjacent


IN_ENGINE = (*ATTENTION, "streaming_llm")  # rows the engine runs as requests


def attention_strategy(name: str) -> Strategy:
    """The Strategy an attention row of the table runs."""
    strategy, options = ATTENTION[name]
    return make_strategy(strategy, options)
RAG_CHUNK = 256


class Evaluator:
    """Holds the engine, the generator and the lingua peer for one run."""

    def __init__(self, plan: EvalPlan, notes: dict[str, str]):
        from ...engine.engine import Engine, EngineConfig

        self.plan = plan
        self.notes = notes
        self.engine = Engine(EngineConfig(model=plan.model, device=plan.device, dtype=plan.dtype, layer=plan.layer))
        # the layer each attention row runs at: l_R, or for Locret the layer of its stored head (as the engine does)
        self.layers = {name: self.engine.strategy_layer(attention_strategy(name), plan.layer) for name in ATTENTION}
        self.tokenizer = self.engine.tokenizer
        self.native = self.engine.spec.native_context
        self.dtype = self.engine.placement.dtype_name  # the compressors' dtype, LLMLingua's included
        self._generator: Generator | None = None
        self._lingua = None
        self._lingua_failed: str | None = None

    @property
    def generator(self) -> Generator:
        if self._generator is None:
            self._generator = Generator(self.engine.checkpoint.path, self.tokenizer, self.plan.chat, self.engine.placement)
        return self._generator

    def lingua(self):
        if self._lingua is None and self._lingua_failed is None:
            from ...kernels.cache_dir import cache_root
            from .lingua import LinguaPeer, lingua_unavailable

            reason = lingua_unavailable()
            if reason is None:
                try:
                    self._lingua = LinguaPeer(self.engine.checkpoint.path, cache_root() / "lingua-model",
                                             str(self.engine.placement.dtype).removeprefix("torch."))  # int8: float32
                except (OSError, RuntimeError, ValueError) as exc:
                    reason = str(exc)
            if reason is not None:
                self._lingua_failed = reason
                self.notes["llmlingua"] = f"LLMLingua not run: {reason}"
                print(f"eval: skipping LLMLingua/LongLLMLingua: {reason}", file=sys.stderr)
        return self._lingua

    def close(self) -> None:
        if self._lingua is not None:
            self._lingua.close()

    def request(self, name: str, sample: RulerSample) -> CompressRequest:
        """The request a row sends the engine for a sample: its strategy and options, the plan's layer and
        budget, DCA as the engine's `auto` (off for ilre_nodca), whole units for the unit rows."""
        strategy, options = ATTENTION.get(name, (name, {}))
        return CompressRequest(context_ids=sample.context_ids, query_ids=sample.query_ids, budget=self.plan.budget,
                               strategy=strategy, strategy_options=dict(options), layer=self.plan.layer,
                               dca="off" if name == "ilre_nodca" else "auto",
                               granularity="unit" if name in UNIT_ROWS else "token")

    def run_sample(self, sample: RulerSample, strategies: list[str]) -> list[Record]:
        plan, tok, engine = self.plan, self.tokenizer, self.engine
        budget, sink = plan.budget, engine.config.prefill.sink
        passes: dict[str, float] = {}  # the encodings this sample's rows read, and the seconds each pass took
        slot = engine.prepare(self.request("streaming_llm", sample)).slot
        units = engine.units(slot, torch.tensor(sample.context_ids))  # as the engine keeps them with the document

        records = []
        for name in strategies:
            start = time.perf_counter()
            dca = layer = peak = coarse_peak = fell_back = None
            kept_ids: list[int] | None = None
            text: str
            if name == "full":
                kept = list(range(len(sample.context_ids)))
                seconds = 0.0
            elif name in IN_ENGINE:
                job = engine.prepare(self.request(name, sample))
                pass_s = 0.0
                if job.model is not None:
                    key = engine.encoding_key(job)
                    if key not in passes:
                        tick = time.perf_counter()
                        engine.encode(job)
                        passes[key] = time.perf_counter() - tick
                    pass_s = passes[key]
                tick = time.perf_counter()
                selection = engine.answer(job)[0]
                kept = selection.kept.tolist()
                peak, coarse_peak = selection.measured.get("peak"), selection.measured.get("coarse_peak")
                fell_back = None if coarse_peak is None else bool(selection.measured.get("deep"))
                seconds = pass_s + time.perf_counter() - tick
                if fell_back:  # the whole-context pass, like the encoding's, is charged to every row that reads it
                    read = selection.timings_ms["deepen"] / 1000.0
                    seconds += passes.setdefault(f"{key} deepened", read) - read
                dca, layer = (job.dca, job.layer) if name in ATTENTION else (None, None)
            elif name == "rag":
                kept = rag_select(tok, sample.context_ids, sample.query, budget, RAG_CHUNK)
                seconds = time.perf_counter() - start
            else:  # llmlingua, longllmlingua
                peer = self.lingua()
                if peer is None:
                    continue
                ids = sample.context_ids
                chunks = [tok.decode(ids[i : i + RAG_CHUNK]) for i in range(0, len(ids), RAG_CHUNK)]
                try:
                    text, seconds = peer.compress(name, chunks, sample.query, budget)
                except RuntimeError as exc:
                    self.notes[f"{name}-error"] = str(exc)
                    print(f"eval: {name} failed on {sample.task} {sample.length}: {exc}", file=sys.stderr)
                    continue
                kept_ids = tok(text, add_special_tokens=False).input_ids
                kept = []
            if kept_ids is None:
                kept_ids = [sample.context_ids[i] for i in kept]
                if name in SEPARATORS:
                    kept_ids = separated(kept, sample.context_ids, tok(SEPARATORS[name], add_special_tokens=False).input_ids)
                text = tok.decode(kept_ids)
            record = Record(sample.task, sample.length, sample.index, sample.seed, name, budget,
                            len(sample.context_ids), len(kept_ids), retention(text, sample.answers),
                            round(seconds, 4), answers=sample.answers, layer=layer if layer is not None else engine.layer, dca=dca,
                            dtype=self.dtype if name in ATTENTION or name in LINGUA_METHODS else None,
                            whole_units=whole_share(units.bounds, kept, sink) if kept else None,
                            headed_rows=headed_share(units.heads, units.bounds, kept, sink), peak=peak, coarse_peak=coarse_peak,
                            fell_back=fell_back)
            if self.generates(name, sample.task, sample.length) and record.retention == 0.0 and TASKS[sample.task].kind in GUESSLESS:
                # no gold text survived: a random 7-digit number, UUID or 5-letter name cannot be
                # produced from the prompt, so the RULER score is 0 without spending a generation
                record.e2e, record.note = 0.0, "not generated: no gold answer in the compressed context"
            elif self.generates(name, sample.task, sample.length):
                n_new = new_token_budget(sample, plan.max_new_tokens, tok)
                tick = time.perf_counter()
                prediction = self.generator.generate(self.generator.prompt(kept_ids, sample), n_new)
                record.generate_s = round(time.perf_counter() - tick, 3)
                record.new_tokens = n_new
                record.prediction = prediction
                record.e2e = score(prediction, sample.answers, sample.metric)
            records.append(record)
        return records

    def generates(self, name: str, task: str, length: int) -> bool:
        """Whether the plan scores this strategy end to end on this task and length."""
        plan = self.plan
        if not plan.e2e or (plan.e2e_tasks and task not in plan.e2e_tasks):
            return False
        if plan.e2e_max_length and length > plan.e2e_max_length and name != "full":
            return False
        return not (name == "full" and plan.full_max_length and length > plan.full_max_length)

    def wanted(self, length: int) -> list[str]:
        plan = self.plan
        out = []
        for name in plan.strategies:
            if name == "full" and not plan.e2e:
                continue  # nothing to measure: retention is 100% by construction
            if name == "full" and plan.full_max_length and length > plan.full_max_length:
                continue
            if name in LINGUA_METHODS and plan.lingua_max_length and length > plan.lingua_max_length:
                continue
            out.append(name)
        return out


def done_cells(records: list[dict], layers: dict[str, int], dtype: str | None, generates) -> set[tuple]:
    """Keys (task, length, index, seed, strategy, budget) of the records this plan need not measure again:
    attention strategies at their layer in `layers` and this dtype, LLMLingua's in this dtype (any dtype
    when `dtype` is None), and with an end-to-end score where `generates(strategy, task, length)` says the
    plan generates (a retention-only record is measured again)."""
    return {(r["task"], r["length"], r["index"], r["seed"], r["strategy"], r["budget"]) for r in records
            if (r["strategy"] not in ATTENTION or r.get("layer") == layers[r["strategy"]])
            and (dtype is None or r["strategy"] not in (*ATTENTION, *LINGUA_METHODS) or (r.get("dtype") or "float32") == dtype)
            and (r.get("e2e") is not None or not generates(r["strategy"], r["task"], r["length"]))}


def run_eval(plan: EvalPlan, results_dir: Path, fresh: bool = False, progress=print) -> Path:
    """Run the plan, appending to results_dir/raw.jsonl (skipping records already there)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    raw = results_dir / "raw.jsonl"
    if fresh and raw.exists():
        raw.unlink()
    meta_path = results_dir / "meta.json"
    earlier = json.loads(meta_path.read_text()) if meta_path.is_file() and not fresh else {}
    caps = widest_caps(earlier.get("caps", {}), plan_caps(plan))  # the page covers every stage's records
    notes = {**earlier.get("notes", {}), **caps_notes(plan, caps)}
    evaluator = Evaluator(plan, notes)
    dtype = evaluator.engine.placement.dtype_name  # records of attention strategies at another layer or dtype are redone
    done = done_cells(load_records(raw), evaluator.layers, None if plan.any_dtype else dtype, evaluator.generates)
    meta = {"plan": asdict(plan), "model": evaluator.engine.model_name, "layer": evaluator.engine.layer,
            "layers": evaluator.layers,
            "placement": evaluator.engine.placement.describe(),
            "calibrated": evaluator.engine.profile.calibrated, "native_context": evaluator.native, "caps": caps, "notes": notes,
            "timing": run_timing(earlier)}  # wall time of every run, summed per placement
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    cells = plan.cells()
    try:
        for n, (task, length, index) in enumerate(cells, 1):
            todo = [s for s in evaluator.wanted(length) if (task, length, index, plan.seed, s, plan.budget) not in done]
            if not todo:
                continue
            tick = time.perf_counter()
            sample = generate_sample(evaluator.tokenizer, task, length, plan.seed, index)
            records = evaluator.run_sample(sample, todo)
            with raw.open("a") as f:
                for record in records:
                    f.write(json.dumps(asdict(record)) + "\n")
            summary = " ".join(f"{r.strategy}={r.retention:.2f}" + (f"/{r.e2e:.2f}" if r.e2e is not None else "") for r in records)
            elapsed = time.perf_counter() - tick
            spent = meta["timing"].setdefault(meta["placement"], {"samples": 0, "seconds": 0.0})
            spent.update(samples=spent["samples"] + 1, seconds=round(spent["seconds"] + elapsed, 1))
            progress(f"[{n}/{len(cells)}] {task} {length_label(length)} #{index}: {summary} ({elapsed:.0f} s)")
            meta_path.write_text(json.dumps({**meta, "notes": notes}, indent=2) + "\n")
    finally:
        evaluator.close()
    return raw
