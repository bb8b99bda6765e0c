"""What `ilre eval` runs: the rows of the table (the strategies and baselines, and the engine's options of the
attention rows), the plan of tasks x lengths x rows with its caps, and the quick and full plans."""

from __future__ import annotations

from dataclasses import dataclass

from ..tasks.ruler import TASKS

STRATEGIES = ("full", "cascade", "cascade_units", "cascade_candidates", "cascade_units_nl", "ilre", "ilre_units", "ilre_nodca", "ilre_fast_too", "ilre_fast_half", "snapkv", "lagkv", "reattention", "locret", "actqkv", "actqkv_auto",
              "streaming_llm", "rag", "llmlingua", "longllmlingua")
# strategies sharing the encoded context (their records depend on l_R and the dtype): name -> (strategy, options)
# ilre_fast_too / ilre_fast_half: ILRe scoring with layer 8 (the embedded model's `fast` l_R) beside l_R at weight 1 / 0.5
ATTENTION = {"cascade": ("cascade", {}), "cascade_units": ("cascade", {}), "cascade_candidates": ("cascade", {"deepen_below": 0.0}),
             "cascade_units_nl": ("cascade", {}), "ilre": ("ilre", {}), "ilre_units": ("ilre", {}), "ilre_nodca": ("ilre", {}), "ilre_fast_too": ("ilre", {"also_layers": (8,), "also_weight": 1.0}),
             "ilre_fast_half": ("ilre", {"also_layers": (8,), "also_weight": 0.5}),
             "snapkv": ("snapkv", {}), "lagkv": ("lagkv", {}),
             "reattention": ("reattention", {}), "locret": ("locret", {}), "actqkv": ("actqkv", {}),
             "actqkv_auto": ("actqkv", {"auto_budget": True})}


@dataclass(frozen=True)
class EvalPlan:
    """What to run. Lengths in tokens (context + query + RULER's tokens_to_generate). Caps for CPU:
    generation runs for lengths <= e2e_max_length, full-context generation (a dense prefill of all
    layers) only up to full_max_length, LLMLingua (a full-model pass over every chunk) only up to
    lingua_max_length; 0 = no cap. e2e_tasks: tasks that generate (empty = all).
    max_new_tokens: cap on RULER's tokens_to_generate (0 = RULER's own)."""

    tasks: tuple[str, ...] = tuple(TASKS)
    lengths: tuple[int, ...] = (4096, 8192, 16384, 32768, 65536, 131072)
    strategies: tuple[str, ...] = STRATEGIES
    samples: int = 3
    budget: int = 1024
    seed: int = 0
    e2e: bool = True
    e2e_tasks: tuple[str, ...] = ()
    e2e_max_length: int = 32768
    full_max_length: int = 16384
    lingua_max_length: int = 8192
    max_new_tokens: int = 0
    chat: bool = True
    model: str | None = None
    long_tasks: tuple[str, ...] = ()  # when set, lengths > long_from run only these tasks
    long_from: int = 0
    long_samples: int = 0  # samples at lengths > long_from (0 = samples)
    device: str = "auto"  # where the compressor and the generator run (models/device.py)
    dtype: str = "auto"  # the compressor's dtype; generation stays float32 on the CPU
    layer: int | str | None = None  # l_R: a number or a profile choice (fast, default, robust); None = the profile's
    any_dtype: bool = False  # records measured in another dtype count as done (resuming on a machine without bfloat16)

    def __post_init__(self) -> None:
        unknown = [t for t in self.tasks + self.e2e_tasks + self.long_tasks if t not in TASKS]
        if unknown:
            raise ValueError(f"tasks: unknown {unknown} (known: {', '.join(TASKS)})")
        bad = [s for s in self.strategies if s not in STRATEGIES]
        if bad:
            raise ValueError(f"strategies: unknown {bad} (known: {', '.join(STRATEGIES)})")
        if self.samples < 1 or self.budget < 8 or not self.lengths or min(self.lengths) < 1024:
            raise ValueError("samples >= 1, budget >= 8 and lengths >= 1024 are required")

    def cells(self) -> list[tuple[str, int, int]]:
        """(task, length, index) in run order: short lengths first, so a cut-short run has them all."""
        out = []
        for length in sorted(self.lengths):
            long = self.long_from and length > self.long_from
            tasks = self.long_tasks if long and self.long_tasks else self.tasks
            n = self.long_samples if long and self.long_samples else self.samples
            out += [(t, length, i) for i in range(n) for t in tasks]
        return out


QUICK_PLAN = EvalPlan(tasks=("niah_single_1", "niah_single_2"), lengths=(4096,),
                      strategies=("ilre", "snapkv", "streaming_llm", "rag"), samples=1, max_new_tokens=16)

# The full run of docs/results.md on a 2-core CPU: every task up to 32K, the four tasks of the
# retention targets at 64K and 128K; generation on those four tasks up to 32K.
TARGET_TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1")
FULL_PLAN = EvalPlan(samples=2, long_tasks=TARGET_TASKS, long_from=32768, long_samples=1,
                     e2e_tasks=TARGET_TASKS, max_new_tokens=32)
