"""The portable runtime's LoRA adapters (templates/tensorrt_llm_pytorch/1/adapters.py) on a real transformers
ContinuousBatchingManager with a tiny random Llama and real PEFT adapters made by peft's own API: each adapter's
greedy tokens equal peft's own generation, and a batch that mixes adapters and the base gives each request its
single-request answer. No server, seconds."""

from __future__ import annotations

import pytest

from tests.conftest import make_peft_adapter
from tests.templates import template_module

sampling = template_module("tensorrt_llm_pytorch", "sampling")
adapters = template_module("tensorrt_llm_pytorch", "adapters")

PROMPTS = ([1, 504, 3458, 282, 4649, 314, 253, 1789, 30], [1, 17, 99, 1203, 5, 77], [1, 2048, 31, 8, 9, 4000, 12])
END = (2, 0)
MAX_NEW = 12


@pytest.fixture(scope="module")
def lora_engine(tiny_llama, tmp_path_factory):
    """An engine folder: the tiny model's weights plus lora/ with two adapters (fr: q,v rank 4; de: every
    projection, rank 8, rsLoRA), as the engine stage writes it (builders.lora.write_adapters)."""
    import shutil

    from builders.lora import read_adapters, write_adapters

    root = tmp_path_factory.mktemp("lora-engine")
    fr = make_peft_adapter(tiny_llama, root / "src-fr", r=4, modules=["q_proj", "v_proj"], seed=1, scale=4.0)
    de = make_peft_adapter(tiny_llama, root / "src-de", r=8, rslora=True, seed=2, scale=4.0,
                      modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    read, problems = read_adapters({"fr": str(fr), "de": str(de)})
    assert not problems, problems
    engine = root / "engine"
    shutil.copytree(tiny_llama, engine)
    write_adapters(read, engine)
    return engine, {"fr": fr, "de": de}


@pytest.fixture(scope="module")
def runner(lora_engine):
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    engine, _ = lora_engine
    model = AutoModelForCausalLM.from_pretrained(str(engine), dtype=torch.float32, attn_implementation="sdpa").eval()
    gcfg = GenerationConfig(max_new_tokens=64, eos_token_id=list(END), pad_token_id=2, **sampling.CREATION_DEFAULTS)
    cbc = ContinuousBatchingConfig(page_size=16, num_blocks=64, max_batch_tokens=256, max_requests_per_batch=8,
                                   per_request_processors=True, use_async_batching=False, allow_block_sharing=False)
    manager = model.init_continuous_batching(generation_config=gcfg, continuous_batching_config=cbc)
    table = sampling.RequestTable()
    sampling.install(manager, table)

    def task_of(state):
        entry = table.get(int(state.logit_processor_kwargs.get(sampling.HANDLE_KWARG, -1)))
        return entry.params.lora_task_id if entry is not None else 0

    lora = adapters.install(manager, str(engine), adapters.read_table(str(engine)), task_of)
    manager.start()
    counter = iter(range(10**6))

    def run(jobs):
        """jobs: [(prompt, lora_task_id)], all added before any result is read (one mixed batch)."""
        rids = []
        for prompt, task_id in jobs:
            params = sampling.parse_params(lambda k: None, end_ids=END, max_new_tokens=MAX_NEW, vocab_size=49152)
            params.lora_task_id = task_id
            handle = table.add(params)
            rid = f"r{next(counter)}"
            manager.add_request(prompt, request_id=rid, max_new_tokens=MAX_NEW, eos_token_id=list(END),
                                **{sampling.HANDLE_KWARG: handle})
            rids.append(rid)
        out = {}
        while len(out) < len(rids):
            res = manager.get_result(timeout=60)
            assert res is not None and not res.error, res
            if res.is_finished():
                out[res.request_id] = list(res.generated_tokens)
        return [out[r] for r in rids]

    yield run, lora, model
    manager.stop(block=True)


def _peft_greedy(base_dir, adapter_dir, prompt):
    """peft's own greedy generation: the reference."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32, attn_implementation="sdpa")
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, str(adapter_dir))
    out = model.eval().generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False,
                                eos_token_id=list(END), pad_token_id=2)
    return out[0, len(prompt):].tolist()


def test_each_adapter_alone_equals_peft(runner, lora_engine, tiny_llama):
    run, lora, _ = runner
    engine, srcs = lora_engine
    assert lora.names == {1: "fr", 2: "de"}
    answers = {}
    for task_id, name in ((0, None), (1, "fr"), (2, "de")):
        [got] = run([(PROMPTS[0], task_id)])
        want = _peft_greedy(tiny_llama, srcs[name] if name else None, PROMPTS[0])
        assert got[:len(want)] == want, (name, got, want)
        answers[task_id] = got
    # the adapters change the answer (else the test could not tell them apart)
    assert len({tuple(a) for a in answers.values()}) == 3, answers


def test_mixed_batch_gives_each_request_its_single_answer(runner):
    run, _, _ = runner
    jobs = [(p, t) for p in PROMPTS for t in (0, 1, 2)]
    alone = [run([job])[0] for job in jobs]
    together = run(jobs)
    assert together == alone


def test_only_puts_a_forward_on_one_adapter(runner):
    import torch

    run, lora, model = runner
    x = torch.tensor([PROMPTS[1]])
    with torch.no_grad():
        base = model(x).logits.clone()
        with lora.only(2):
            adapted = model(x).logits.clone()
        again = model(x).logits.clone()
    assert not torch.allclose(base, adapted)
    assert torch.equal(base, again)
    with pytest.raises(KeyError):
        lora.index(7)





def test_the_stacks_hold_what_the_plan_counts(runner, lora_engine):
    """The plan's LoRA bytes for the portable runtime (builders.plan.lora_plan: one slot per adapter, of the
    largest rank, on the adapted modules) are the bytes the runtime's stacks hold."""
    import json

    from builders.lora import slot_bytes
    from builders.model_shape import ModelShape

    _, lora, _ = runner
    engine, _ = lora_engine
    shape = ModelShape.from_hf_config(json.loads((engine / "config.json").read_text()))
    held = sum((m.a_cat.numel() + m.b_cat.numel()) * m.a_cat.element_size() for m in lora.modules.values())
    modules = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert held == lora.count * slot_bytes(shape, modules, lora.rank, 4)
