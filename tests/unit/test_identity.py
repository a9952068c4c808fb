"""A server's identity: its start-up answers, and its answers' `text` against the job's tokenizer
(`generation.identity`), as SGLang 0.5.23's detokenizer makes that text, edges included (the texts
pinned here are what its DetokenizerManager made of the same ids)."""

import asyncio
import random

import pytest
from transformers import AutoTokenizer

from eagle3_datagen.engine.protocol import SamplingParams, decode_output_text, finish_length
from eagle3_datagen.generation.identity import (
    AnswerCheck,
    ServerMismatch,
    check_answer_text,
    check_model_info,
    sglang_text,
)

# Our requests' parameters, as the engine reads them.
OUR_PARAMS = SamplingParams.from_request({"skip_special_tokens": False, "no_stop_trim": True})


@pytest.fixture(scope="module")
def tiktoken_tokenizer(kimi_tiktoken_dir):
    return AutoTokenizer.from_pretrained(str(kimi_tiktoken_dir), trust_remote_code=True)


@pytest.fixture(params=["qwen3", "kimi_shaped", "kimi_tiktoken"])
def tokenizer(request):
    name = {"qwen3": "qwen3_tokenizer", "kimi_shaped": "kimi_tokenizer", "kimi_tiktoken": "tiktoken_tokenizer"}
    return request.getfixturevalue(name[request.param])


def split_char(tok) -> list[int]:
    """The ids of a character the tokenizer writes as several byte pieces (flamingo, or a rare CJK one)."""
    for ch in ("🦩", "𠀀", "🪿"):
        ids = tok.encode(ch, add_special_tokens=False)
        if len(ids) > 1:
            return ids
    raise AssertionError("no character split into byte pieces")


def answer_ids(tok, rng: random.Random, n: int = 120) -> list[int]:
    """An answer of `n` ids: words, special ids, and characters split into byte pieces."""
    words = tok.encode(" Let me think: 42 is the answer, 中文 too.", add_special_tokens=False)
    specials = sorted(set(tok.get_added_vocab().values()))[:40]
    pieces = split_char(tok)
    ids: list[int] = []
    while len(ids) < n:
        ids += rng.choice([words, pieces, [rng.choice(specials)], [rng.randrange(50_000)]])
    return ids[:n]


def test_the_engines_text_and_sglangs_pass_for_byte_level_tokenizers(tokenizer):
    """Qwen3's, and Kimi's in both formats: the engine answers the output decoded whole, SGLang the
    pieces of its detokenizer (delivered every 50 tokens, or 1, or 7), and the check accepts both."""
    rng = random.Random(7)
    prompt = tokenizer.encode("Question: what is 6 x 7?", add_special_tokens=False)
    for _ in range(6):
        ids = answer_ids(tokenizer, rng)
        engine_text = decode_output_text(tokenizer, ids, finish_length(len(ids)), OUR_PARAMS)
        assert engine_text == tokenizer.decode(ids, skip_special_tokens=False)
        assert check_answer_text(engine_text, ids, tokenizer) is None
        assert check_answer_text(engine_text, ids, tokenizer, prompt_ids=prompt) is None
        assert check_answer_text(sglang_text(tokenizer, ids, prompt), ids, tokenizer, prompt_ids=prompt) is None
        for interval in (1, 7):  # other intervals give the same text for these answers
            assert sglang_text(tokenizer, ids, prompt, interval) == engine_text


def test_sglangs_repeated_text_where_two_deliveries_end_inside_characters(qwen3_tokenizer):
    """SGLang 0.5.23's detokenizer sends part of a piece that ends inside a character
    (`find_printable_text`); when the next delivery ends inside one too with less printable, the
    difference is sent twice. The text below is what its DetokenizerManager made of these ids,
    delivered at 50 and 100 tokens and at the end: "Look中" twice."""
    tok = qwen3_tokenizer
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    ids = enc(" Look") * 47 + enc("中") + enc("𠀀") + enc("x") * 48 + enc("🦩") + enc(" end.")
    assert len(enc("𠀀")) == 3 and len(enc("🦩")) == 2 and len(ids) == 103  # deliveries inside both
    real = " Look" * 47 + "中Look中𠀀" + "x" * 48 + "🦩 end."
    prompt = enc("Say it.")
    assert sglang_text(tok, ids, prompt) == real != tok.decode(ids)
    assert check_answer_text(real, ids, tok, prompt_ids=prompt) is None
    assert check_answer_text(tok.decode(ids), ids, tok, prompt_ids=prompt) is None  # the engine's text


def test_an_answer_cut_inside_a_character_ends_in_a_replacement_char_on_both_sides(qwen3_tokenizer):
    tok = qwen3_tokenizer
    ids = tok.encode("The bird:", add_special_tokens=False) + split_char(tok)[:-1]
    server = sglang_text(tok, ids, tok.encode("Name a bird.", add_special_tokens=False), interval=2)
    assert server.endswith("\ufffd") and server == tok.decode(ids)
    assert check_answer_text(server, ids, tok) is None


def test_a_prompt_ending_inside_a_character_is_the_one_edge_and_needs_the_prompt(qwen3_tokenizer):
    """SGLang decodes the first pieces after the prompt's last 5 ids: where the prompt ends inside a
    character, the answer's text starts after that character, not with its stray bytes."""
    tok = qwen3_tokenizer
    pieces = split_char(tok)
    prompt = tok.encode("A bird:", add_special_tokens=False) + pieces[:1]
    ids = pieces[1:] + tok.encode(" pink and tall.", add_special_tokens=False)
    server = sglang_text(tok, ids, prompt)
    assert server == " pink and tall." and tok.decode(ids).startswith("\ufffd")
    assert check_answer_text(server, ids, tok, prompt_ids=prompt) is None
    assert "first differ at character 0" in check_answer_text(server, ids, tok)


def test_another_tokenizer_is_refused_naming_where_the_texts_part(qwen3_tokenizer, kimi_tokenizer):
    """Kimi-shaped and Qwen3 share the byte-level ids 0..151642: the texts agree up to the first
    special id, and the reason shows where they part."""
    tok = qwen3_tokenizer
    head = tok.encode("Let me think about it", add_special_tokens=False)
    ids = head + [tok.convert_tokens_to_ids("</think>")] + tok.encode("\n\n42", add_special_tokens=False)
    server = kimi_tokenizer.decode(ids, skip_special_tokens=False)  # what a Kimi server answers
    reason = check_answer_text(server, ids, tok, prompt_ids=[1, 2, 3])
    at = len("Let me think about it<")  # Kimi's id 151668 is a reserved token: "<|reserved_token_..."
    assert f"first differ at character {at}:" in reason
    assert "server …'nk about it<|reserved_to'…" in reason and "vs config …'nk about it</think>" in reason
    assert f"{len(ids)} output ids" in reason


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t + " ",  # a trailing space
        lambda t: t[:-1],  # a character short
        lambda t: " " + t,  # a leading space (the prompt-context edge needs the prompt to be shown)
        lambda t: t.replace("</think>", "</think> "),  # spaces between special tokens
        lambda t: t.replace("<|im_end|>", ""),  # the stop token trimmed
    ],
)
def test_nothing_else_is_tolerated(qwen3_tokenizer, change):
    tok = qwen3_tokenizer
    ids = tok.encode("Reasoning.", add_special_tokens=False) + [tok.convert_tokens_to_ids("</think>")]
    ids += tok.encode("\n\nDone.", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    text = tok.decode(ids, skip_special_tokens=False)
    assert check_answer_text(text, ids, tok) is None
    assert "first differ at character" in check_answer_text(change(text), ids, tok)


def test_an_answer_without_text_is_refused(qwen3_tokenizer):
    assert "--skip-tokenizer-init" in check_answer_text(None, [1, 2], qwen3_tokenizer)
    assert "not a string" in check_answer_text(["a"], [1, 2], qwen3_tokenizer)


def test_model_info_refuses_what_cannot_serve_the_job_and_names_the_field():
    url = "http://h:1"
    line = check_model_info(
        {"is_generation": True, "model_path": "/m/Qwen3", "tokenizer_path": "/m/Qwen3", "model_type": "qwen3"},
        {"skip_tokenizer_init": False},
        url=url,
        tokenizer="/shared/Qwen3",
    )
    assert "model_path '/m/Qwen3'" in line and "model.tokenizer /shared/Qwen3" in line
    with pytest.raises(
        ServerMismatch, match=r"http://h:1: /model_info is_generation is false .*'/m/emb'.* must be true"
    ):
        check_model_info({"is_generation": False, "model_path": "/m/emb"}, {}, url=url, tokenizer="/t")
    with pytest.raises(ServerMismatch, match=r"skip_tokenizer_init is true \(server\) but must be false \(config\)"):
        check_model_info({"is_generation": True}, {"skip_tokenizer_init": True}, url=url, tokenizer="/t")


def test_answers_wait_until_their_server_is_confirmed_and_a_mismatch_keeps_none(qwen3_tokenizer):
    tok = qwen3_tokenizer
    ids = tok.encode("Fine.", add_special_tokens=False)
    good = b'{"text":"Fine.","output_ids":[]}'
    bad = b'{"text":"Fine!","output_ids":[]}'

    async def scenario():
        check = AnswerCheck(tok, tokenizer_dir="/t", answers=3)
        kept = []

        async def answer(url, rid, raw):
            await check.vet(url, rid, raw, ids, [], None)
            kept.append(rid)

        # Two agreeing answers of A wait for the third; B's first one too.
        tasks = [asyncio.create_task(answer(u, r, good)) for u, r in (("A", "a1"), ("A", "a2"), ("B", "b1"))]
        await asyncio.sleep(0)
        assert check.holding == 3 and kept == []
        await answer("A", "a3", good)  # A confirmed: its answers go on, B's still waits
        await asyncio.sleep(0)
        assert sorted(kept) == ["a1", "a2", "a3"] and check.holding == 1
        b2 = asyncio.create_task(answer("B", "b2", good))
        await asyncio.sleep(0)
        with pytest.raises(
            ServerMismatch, match=r"B answers as another model .* rid b3: .*first differ at character 4"
        ):
            await answer("B", "b3", bad)
        results = await asyncio.gather(tasks[2], b2, return_exceptions=True)
        assert all(isinstance(r, ServerMismatch) for r in results) and "b1" not in kept and "b2" not in kept
        with pytest.raises(ServerMismatch):  # a refused server's later answers are refused too
            await answer("B", "b4", good)
        # Nothing else can come: the answers waiting are kept.
        c1 = asyncio.create_task(answer("C", "c1", good))
        await asyncio.sleep(0)
        check.release_if_stuck(2)  # another task still runs: C's answer waits on
        assert check.holding == 1
        check.release_if_stuck(1)
        await c1
        assert "c1" in kept
        # A server refused after some of its answers were let go says so.
        with pytest.raises(
            ServerMismatch, match=r"C answers .*: 1 earlier answer\(s\) of it, each agreeing, were kept"
        ):
            await answer("C", "c2", bad)

    asyncio.run(scenario())
