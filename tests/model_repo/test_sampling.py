"""The portable runtime's per-request sampling (templates/tensorrt_llm_pytorch/1/sampling.py) on a
real transformers ContinuousBatchingManager with a tiny random Llama: no server, seconds."""

from __future__ import annotations

import pytest

from tests.templates import template_module

sampling = template_module("tensorrt_llm_pytorch", "sampling")

PROMPT = [1, 504, 3458, 282, 4649, 314, 253, 1789, 30]
END = (2, 0)


@pytest.fixture(scope="module")
def runner(tiny_llama):
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32, attn_implementation="sdpa").eval()
    gcfg = GenerationConfig(max_new_tokens=64, eos_token_id=list(END), pad_token_id=2, **sampling.CREATION_DEFAULTS)
    cbc = ContinuousBatchingConfig(page_size=16, num_blocks=64, max_batch_tokens=256, max_requests_per_batch=4,
                                   per_request_processors=True, use_async_batching=False)
    manager = model.init_continuous_batching(generation_config=gcfg, continuous_batching_config=cbc)
    table = sampling.RequestTable()
    sampling.install(manager, table)
    manager.start()
    counter = iter(range(10**6))

    def run(max_new=12, **opts):
        names = {"top_k": "runtime_top_k", "top_p": "runtime_top_p"}  # the backend's names (seed is `seed`)
        lists = {k: opts.pop(k) for k in ("bad_words", "embedding_bias") if k in opts}
        given = {names.get(k, k): v for k, v in opts.items()}
        params = sampling.parse_params(given.get, end_ids=END, max_new_tokens=max_new, vocab_size=49152, **lists)
        handle = table.add(params)
        rid = f"r{next(counter)}"
        manager.add_request(PROMPT, request_id=rid, max_new_tokens=max_new, eos_token_id=list(END),
                            **{sampling.HANDLE_KWARG: handle})
        while True:
            res = manager.get_result(request_id=rid, timeout=60)
            assert res is not None and not res.error, res
            if res.is_finished():
                entry = table.get(handle)
                table.drop(handle)
                return list(res.generated_tokens), entry

    yield run
    manager.stop(block=True)


def test_greedy_is_deterministic_and_top_k_1_equals_greedy(runner):
    greedy, _ = runner()
    assert greedy == runner()[0]
    # temperature alone is greedy (TensorRT-LLM: top_k 0 and top_p 0, the defaults, mean greedy)
    assert runner(temperature=1.5, seed=3)[0] == greedy
    assert runner(top_k=1, temperature=1.5, seed=3)[0] == greedy
    assert runner(temperature=0.0, top_p=0.9)[0] == greedy


def test_seeded_sampling_repeats_and_seeds_differ(runner):
    a, _ = runner(temperature=1.5, top_p=1.0, seed=1)
    assert runner(temperature=1.5, top_p=1.0, seed=1)[0] == a
    others = [runner(temperature=1.5, top_p=1.0, seed=s)[0] for s in (2, 3)]
    assert any(o != a for o in others)


def _repeats(tokens):
    return len(tokens) - len(set(tokens))


def test_repetition_penalty_reduces_repeats(runner):
    """The greedy answer of the tiny random model repeats itself (a precondition, checked: otherwise there would
    be nothing to reduce); the same request with a repetition penalty repeats less, here not at all."""
    plain, _ = runner(max_new=24)
    assert len(plain) == 24 and _repeats(plain) >= 12, f"precondition: the unpenalised answer repeats: {plain}"
    penalised, _ = runner(max_new=24, repetition_penalty=10.0)
    assert len(penalised) == len(plain), (plain, penalised)
    assert _repeats(penalised) < _repeats(plain), (plain, penalised)
    assert _repeats(penalised) == 0, penalised
    assert len(set(penalised)) > len(set(plain)) or len(set(penalised)) == len(penalised), (plain, penalised)


def test_min_tokens_holds_back_end_ids(runner):
    out, _ = runner(max_new=20, min_tokens=20)
    assert len(out) == 20 and not set(out[:-1]) & set(END)


def test_log_probs_are_recorded_per_token(runner):
    out, entry = runner(max_new=6, return_log_probs=True)
    assert len(entry.log_probs) >= len(out) and all(lp <= 0 for lp in entry.log_probs)


def test_top_log_probs_are_the_plain_forwards_most_likely_tokens(runner, tiny_llama):
    """num_top_logprobs k: per generated token, the k most likely tokens and their log probabilities, most likely
    first, equal to torch.log_softmax of a plain forward of the same model over the same prefix (the continuous
    batching's paged attention changes nothing above 1e-4); greedy: the first is the token generated, with its
    return_log_probs value. Without return_log_probs the alternatives come alone."""
    import torch
    from transformers import AutoModelForCausalLM

    out, entry = runner(max_new=5, return_log_probs=True, num_top_logprobs=4)
    assert len(entry.top) >= len(out) == 5
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([PROMPT + out])).logits[0].float(), dim=-1)
    for i, token in enumerate(out):
        values, ids = entry.top[i]
        want = torch.topk(ref[len(PROMPT) - 1 + i], 4)
        assert ids == want.indices.tolist() and values == pytest.approx(want.values.tolist(), abs=1e-4)
        assert values == sorted(values, reverse=True) and ids[0] == token and values[0] == entry.log_probs[i]
    alone, entry = runner(max_new=3, num_top_logprobs=2)
    assert alone == out[:3] and not entry.log_probs and [ids for _, ids in entry.top[:3]] == \
        [ids[:2] for _, ids in runner(max_new=3, num_top_logprobs=4)[1].top[:3]]


@pytest.mark.parametrize("opts, match", [({"temperature": -1.0}, "temperature"), ({"top_p": 1.5}, "top_p"),
                                         ({"min_tokens": 50}, "min_tokens"), ({"repetition_penalty": 0.0},
                                                                              "repetition_penalty"),
                                         ({"num_top_logprobs": 21}, "num_top_logprobs = 21: must be between 0 "
                                                                    "and 20"),
                                         ({"num_top_logprobs": -1}, "num_top_logprobs = -1")])
def test_bad_options_are_refused(opts, match):
    names = {"top_p": "runtime_top_p"}
    with pytest.raises(sampling.SamplingError, match=match):
        sampling.parse_params({names.get(k, k): v for k, v in opts.items()}.get, end_ids=END, max_new_tokens=16)


def _finite(row):
    import torch

    return set(torch.nonzero(torch.isfinite(row)).view(-1).tolist())


def test_warp_top_k_top_p_and_temperature_keep_the_right_tokens():
    import torch

    logits = torch.log(torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15]))
    p = sampling.SamplingParams(greedy=False)
    assert _finite(sampling.warp(logits, p)) == {0, 1, 2, 3, 4}
    p.top_k = 2
    assert _finite(sampling.warp(logits, p)) == {1, 3}
    p.top_k, p.top_p = 0, 0.6  # 0.4 < 0.6 <= 0.4 + 0.3: the two most likely
    assert _finite(sampling.warp(logits, p)) == {1, 3}
    p.top_p = 0.1  # below the most likely token's mass: that token alone
    assert _finite(sampling.warp(logits, p)) == {1}
    p.top_p, p.temperature = 1.0, 2.0
    assert torch.allclose(sampling.warp(logits, p), logits / 2)


def test_sampled_requests_respect_top_k(runner):
    """top_k=2 with a hot temperature: every drawn token is one of the two most likely at its step,
    which greedy decoding of the same prefix confirms for the first token."""
    greedy, _ = runner(max_new=1)
    firsts = {runner(max_new=1, temperature=50.0, top_k=2, seed=s)[0][0] for s in range(12)}
    assert greedy[0] in firsts and len(firsts) == 2, firsts


def test_bad_words_are_never_generated(runner):
    """bad_words_list (transformers' NoBadWordsLogitsProcessor per request): a one-token word never comes,
    a two-token word's second token never follows its first."""
    greedy, _ = runner(max_new=8)
    out, _ = runner(max_new=8, bad_words=[[greedy[0]]])
    assert greedy[0] not in out and out != greedy
    # a pair a seeded answer holds at i, i+1, where its head comes for the first time (the prompt counts: the
    # ban applies wherever the sequence ends with the head), so the same draws lead up to it
    opts = {"temperature": 1.5, "top_p": 1.0, "seed": 5}
    base, _ = runner(max_new=12, **opts)
    seq = PROMPT + base
    i = next(i for i in range(len(base) - 1) if base[i] not in seq[:len(PROMPT) + i])
    pair = base[i:i + 2]
    out, _ = runner(max_new=12, bad_words=[pair], **opts)
    assert out[:i + 1] == base[:i + 1] and out[i + 1] != base[i + 1]  # the pair's head stays allowed
    assert not any((PROMPT + out)[j:j + 2] == pair for j in range(len(PROMPT) + len(out) - 1))


def test_embedding_bias_moves_the_logits(runner):
    greedy, _ = runner(max_new=4)
    target = 4649
    bias = [0.0] * (target + 1)
    bias[target] = 1e4
    out, _ = runner(max_new=4, embedding_bias=bias)
    assert out == [target] * 4 and greedy != out
    assert runner(max_new=4, embedding_bias=[0.0] * 10)[0] == greedy  # zeros: no bias
    with pytest.raises(sampling.SamplingError, match="vocab_size"):
        sampling.parse_params({}.get, end_ids=END, max_new_tokens=4, embedding_bias=[0.0] * 49153, vocab_size=49152)


def test_generation_logits_are_the_raw_logits_of_each_step(runner):
    import numpy as np

    greedy, entry = runner(max_new=5, return_generation_logits=True)
    assert len(entry.logits) >= len(greedy) and entry.logits[0].shape == (49152,)
    assert [int(np.argmax(row)) for row in entry.logits[:len(greedy)]] == greedy  # greedy: argmax of each row
