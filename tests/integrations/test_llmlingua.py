"""The LLMLingua-compatible API: LLMLingua's README examples with only the import changed, in process and
against a real ilre server on loopback (gRPC and HTTP); its answer has LLMLingua's keys, types and formats
(compared with LLMLingua's own output where its environment exists: `make test` builds it); options
without a counterpart are refused by name."""

from __future__ import annotations

import os
import re

import pytest

from ilre.evaluation.tasks.haystack import shakespeare_text
from ilre.integrations.llmlingua import PromptCompressor  # was: from llmlingua import PromptCompressor

from tests.service.conftest import LINES_QUERY, lines_context

ANSWER = "The vault code of the museum is 4471."
QUESTION = "Question: What is the vault code of the museum?\nAnswer:"
INSTRUCTION = "Answer the question from the passages."
KEYS = {"compressed_prompt", "origin_tokens", "compressed_tokens", "ratio", "rate", "saving"}
FORMATS = {"ratio": r"\d+\.\dx", "rate": r"\d+\.\d%", "saving": r", Saving \$\d+\.\d in GPT-4\."}


def passages(chars: int = 3000) -> list[str]:
    """Four retrieved passages of Shakespeare (~700 tokens each at 3,000 chars); the third holds the answer."""
    text = shakespeare_text()
    chunks = [text[i * chars:(i + 1) * chars] for i in range(4)]
    chunks[2] = chunks[2][:chars // 2] + " " + ANSWER + " " + chunks[2][chars // 2:]
    return chunks


def check_answer(result: dict) -> None:
    """LLMLingua's keys, their types, its formats, and figures that agree with each other."""
    assert set(result) == KEYS
    assert isinstance(result["compressed_prompt"], str)
    assert isinstance(result["origin_tokens"], int) and isinstance(result["compressed_tokens"], int)
    for key, pattern in FORMATS.items():
        assert re.fullmatch(pattern, result[key]), (key, result[key])
    assert result["ratio"] == f"{result['origin_tokens'] / result['compressed_tokens']:.1f}x"


@pytest.fixture(scope="module")
def in_process() -> PromptCompressor:
    return PromptCompressor()  # the README's first line: the embedded model, loaded here


def test_readme_example_llmlingua(in_process):
    """LLMLingua's first README example as written: a plain prompt, no question, target_token=200."""
    prompt = "\n\n".join(passages()) + "\n\n" + QUESTION
    llm_lingua = in_process
    compressed_prompt = llm_lingua.compress_prompt(prompt, instruction="", question="", target_token=200)
    check_answer(compressed_prompt)
    assert compressed_prompt["compressed_tokens"] == 200
    assert compressed_prompt["origin_tokens"] > 2000
    assert compressed_prompt["compressed_prompt"].endswith("What is the vault code of the museum?\nAnswer:")


def test_readme_example_longllmlingua(in_process):
    """LongLLMLingua's README example as written (only the import changed): the contexts sorted by the share
    of the question's attention they hold, the budget re-shared by rank; the answer survives at rate 0.55."""
    llm_lingua, prompt_list, question = in_process, passages(), QUESTION
    compressed_prompt = llm_lingua.compress_prompt(
        prompt_list,
        question=question,
        rate=0.55,
        # Set the special parameter for LongLLMLingua
        condition_in_question="after_condition",
        reorder_context="sort",
        dynamic_context_compression_ratio=0.3,  # or 0.4
        condition_compare=True,
        context_budget="+100",
        rank_method="longllmlingua",
    )
    check_answer(compressed_prompt)
    prompt = compressed_prompt["compressed_prompt"]
    assert prompt.endswith(question)
    head = prompt[:12]  # sorted: the passage holding the answer comes first
    assert [head in chunk for chunk in prompt_list] == [False, False, True, False] and ANSWER in prompt
    assert compressed_prompt["compressed_tokens"] <= 0.55 * compressed_prompt["origin_tokens"] + 1


def test_readme_example_llmlingua2(in_process):
    """LLMLingua-2's README example with model_name left out: force_tokens=['\\n', '?'] is what whole units
    keep (each carries its own line break or mark); iterative_size is accepted with a warning."""
    prompt = "\n".join(lines_context().split("\n")[:200]) + "\n" + LINES_QUERY
    llm_lingua = PromptCompressor(
        use_llmlingua2=True,  # Whether to use llmlingua-2
    )
    compressed_prompt = llm_lingua.compress_prompt(prompt, rate=0.33, force_tokens=["\n", "?"])
    check_answer(compressed_prompt)
    assert compressed_prompt["compressed_tokens"] <= 0.33 * compressed_prompt["origin_tokens"] + 1
    with pytest.warns(UserWarning, match=r"^iterative_size: accepted and without effect"):
        llm_lingua.compress_prompt(prompt, rate=0.33, iterative_size=100)
    with pytest.raises(ValueError, match=r"^force_tokens: .*cannot force 'the'"):
        llm_lingua.compress_prompt(prompt, rate=0.33, force_tokens=["\n", "the"])


def test_readme_example_llmlingua2_model_names_what_to_do():
    with pytest.raises(ValueError, match=r"^model_name: .*LLMLingua-2 token classifier.*leave model_name out"):
        PromptCompressor(model_name="microsoft/llmlingua-2-xlm-roberta-large-meetingbank", use_llmlingua2=True)


def test_context_options_force_sort_and_share(local_service):
    """force_context_ids keeps a context whole within the budget; reorder_context="sort" puts forced contexts,
    then the most attended ones first and drops contexts with nothing kept; without options the contexts keep
    their order."""
    compressor = PromptCompressor(target=f"127.0.0.1:{local_service.grpc_port}")
    chunks = passages()
    forced = compressor.compress_prompt(chunks, question=QUESTION, target_token=1600, force_context_ids=[0],
                                        reorder_context="sort")
    check_answer(forced)
    prompt = forced["compressed_prompt"]
    assert prompt.startswith(chunks[0] + "\n\n")  # the forced context whole, then the answer's
    rest = prompt[len(chunks[0]) + 2:]
    assert ANSWER in rest and not any(rest.startswith(chunk[:12]) for chunk in chunks)  # then compressed ones
    assert forced["compressed_tokens"] <= 1600 + compressor._count(QUESTION)
    plain = compressor.compress_prompt(chunks, question=QUESTION, target_token=300, granularity="unit")
    kept = compressor.compress_prompt(chunks, question=QUESTION, target_token=300, reorder_context="original",
                                      force_context_ids=[])
    assert plain["compressed_tokens"] == kept["compressed_tokens"] and ANSWER in plain["compressed_prompt"]
    with pytest.raises(ValueError, match=r"^reorder_context: .*two_stage is not offered"):
        compressor.compress_prompt(chunks, question=QUESTION, reorder_context="two_stage")
    with pytest.raises(ValueError, match=r"^force_context_ids: must be a list of context indices in 0\.\.3"):
        compressor.compress_prompt(chunks, question=QUESTION, force_context_ids=[7])
    with pytest.raises(ValueError, match=r"^reorder_context: works on whole units"):
        compressor.compress_prompt(chunks, question=QUESTION, reorder_context="sort", granularity="token")


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_remote_instruction_context_question(local_service, transport):
    target = (f"127.0.0.1:{local_service.grpc_port}" if transport == "grpc"
              else f"http://127.0.0.1:{local_service.http_port}")
    result = PromptCompressor(target=target).compress_prompt(passages(), instruction=INSTRUCTION, question=QUESTION,
                                                             rate=0.3)
    check_answer(result)
    prompt = result["compressed_prompt"]
    assert prompt.startswith(INSTRUCTION + "\n\n") and prompt.endswith("\n\n" + QUESTION)
    assert ANSWER in prompt
    # LLMLingua's rule: 30% of the whole prompt, the instruction and the question kept whole
    assert abs(result["compressed_tokens"] - 0.3 * result["origin_tokens"]) <= 1


def test_remote_transports_agree(local_service):
    grpc = PromptCompressor(target=f"127.0.0.1:{local_service.grpc_port}")
    http = PromptCompressor(target=f"http://127.0.0.1:{local_service.http_port}")
    args = dict(question=QUESTION, target_token=300, concate_question=False)
    a, b = grpc.compress_prompt(passages(), **args), http.compress_prompt(passages(), **args)
    assert a == b
    assert not a["compressed_prompt"].endswith(QUESTION)  # concate_question=False leaves it out, as LLMLingua does


@pytest.mark.parametrize("kwargs, message", [
    ({"force_tokens": ["\n", "!!"]}, r"^force_tokens: .*cannot force"),
    ({"use_token_level_filter": False, "granularity": "token"}, r"^use_token_level_filter: .*whole contexts alone"),
    ({"keep_sentence_number": 2}, r"^keep_sentence_number: .*cannot force"),
    ({"granularity": "sentence"}, r"^granularity: must be one of token, unit \(got 'sentence'\)"),
    ({"use_sentence_level_filter": True, "granularity": "token"}, r"^use_sentence_level_filter: .*give one of them"),
    ({"rate": 1.5}, r"^rate: must be a number in \(0, 1\]"),
    ({"rank_method": "bm25"}, r"^rank_method: must be one of llmlingua, longllmlingua"),
    ({"rank_method": "longllmlingua", "question": ""}, r"^question: LongLLMLingua's ranking"),
])
def test_options_without_a_mapping_are_refused_by_name(local_service, kwargs, message):
    compressor = PromptCompressor(target=f"127.0.0.1:{local_service.grpc_port}")
    with pytest.raises(ValueError, match=message):
        compressor.compress_prompt(passages(), **{"question": QUESTION, **kwargs})
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_option'"):
        compressor.compress_prompt(passages(), question=QUESTION, no_such_option=1)


def test_sentence_level_filter_keeps_whole_sentences(local_service):
    """use_sentence_level_filter=True is granularity "unit": the kept context is whole lines of it (but the
    sink's first tokens and one line cut to fill the budget), the same as granularity="unit" given directly."""
    compressor = PromptCompressor(target=f"127.0.0.1:{local_service.grpc_port}")
    text, args = lines_context(), dict(question=LINES_QUERY, target_token=60)
    sentences = compressor.compress_prompt(text, use_sentence_level_filter=True, **args)
    check_answer(sentences)
    kept = sentences["compressed_prompt"].removesuffix("\n\n" + LINES_QUERY).split("\n")
    whole = set(text.split("\n"))
    assert len([line for line in kept[1:] if line not in whole]) <= 1, kept
    assert len([line for line in kept if line in whole and line]) >= 1
    assert sentences == compressor.compress_prompt(text, use_sentence_level_filter=True, use_token_level_filter=False,
                                                   **args)
    assert sentences == compressor.compress_prompt(text, granularity="unit", **args)
    assert sentences == PromptCompressor(target=f"127.0.0.1:{local_service.grpc_port}", granularity="unit"
                                         ).compress_prompt(text, **args)
    assert sentences == compressor.compress_prompt(text, **args)  # the service's default keeps whole units too
    assert sentences != compressor.compress_prompt(text, granularity="token", **args)
    with pytest.raises(ValueError, match=r"^granularity: must be one of token, unit \(got 'lines'\)"):
        PromptCompressor(granularity="lines")


def test_same_keys_types_and_formats_as_llmlingua_itself(local_service, tmp_path):
    """LLMLingua's real answer on the same input (its own environment, counting the model's tokens)."""
    from ilre.evaluation.running.lingua import LinguaPeer, lingua_unavailable
    from ilre.models.embedded import embedded_checkpoint

    reason = lingua_unavailable()
    if reason is not None:
        if os.environ.get("ILRE_REQUIRE_LINGUA"):
            pytest.fail(f"LLMLingua's environment is required here: {reason}")
        pytest.skip(reason)
    peer = LinguaPeer(embedded_checkpoint(), tmp_path / "lingua-model")
    try:  # passages of ~250 tokens: the keys, types and formats are the point, and LLMLingua's model reads every token
        theirs = peer.call(passages(1000), instruction=INSTRUCTION, question=QUESTION, rate=0.3)
    finally:
        peer.close()
    ours = PromptCompressor(target=f"127.0.0.1:{local_service.grpc_port}").compress_prompt(
        passages(1000), instruction=INSTRUCTION, question=QUESTION, rate=0.3)
    assert set(ours) == set(theirs) == KEYS
    assert {k: type(v) for k, v in ours.items()} == {k: type(v) for k, v in theirs.items()}
    for key, pattern in FORMATS.items():
        assert re.fullmatch(pattern, theirs[key]), (key, theirs[key])
    assert theirs["compressed_prompt"].startswith(INSTRUCTION) and theirs["compressed_prompt"].endswith(QUESTION)
    # both count the model's own tokens of the same parts: the original sizes agree within the separators
    assert abs(ours["origin_tokens"] - theirs["origin_tokens"]) <= 8
