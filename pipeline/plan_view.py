"""Render a :class:`~builders.plan.Plan` as readable tables (rich) for ``trtpipe plan``."""

from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.table import Table

from builders.plan import Plan
from builders.plan_warnings import human_bytes
from builders.prequant import Prequantized


def render_plan(plan: Plan, console: Optional[Console] = None) -> None:
    """Print the plan: build summary, memory per rank, KV pool, plugins, runtime settings, warnings."""
    con = console or Console()
    m, kv = plan.memory, plan.memory.kv
    head = Table(title=f"plan: {plan.build} on {plan.target}", show_header=False, title_justify="left")
    head.add_column("key", style="bold")
    head.add_column("value")
    sm = "cpu" if plan.target_sm is None else f"SM {plan.target_sm}"
    head.add_row("target", f"{plan.target} ({sm}, {plan.target_memory_gib:g} GiB per device, "
                           f"{plan.gpus_available} device(s) available)")
    dp = f" x attention DP {plan.attention_dp_size}" if plan.attention_dp_size > 1 else ""
    head.add_row("runtime", f"{plan.runtime} (serves tp={plan.serving_tp}{dp} x pp={plan.serving_pp}; TensorRT-LLM "
                            f"{plan.tensorrt_llm_versions})")
    head.add_row("model", f"{plan.model.architecture}: {plan.model.num_hidden_layers} layers, hidden "
                          f"{plan.model.hidden_size}, {plan.model.num_attention_heads} heads / "
                          f"{plan.model.num_key_value_heads} KV heads x {plan.model.head_dim}, vocab "
                          f"{plan.model.vocab_size} (padded {plan.vocab_padded}), {plan.memory.params_total / 1e6:.1f}M params"
                          + (f"; {plan.model.num_experts} experts, top-{plan.model.num_experts_per_tok}, "
                             f"{plan.memory.params_active / 1e6:.1f}M active per token" if plan.model.is_moe else ""))
    sq = plan.source_quantization
    head.add_row("checkpoint", ("model.source as it is (already quantized: the quantize stage does not run)" if sq
                                else f"{plan.checkpoint_format or 'none (refused)'}")
                               + (f", moe_tp_size {plan.moe_tp_size} x moe_ep_size {plan.moe_ep_size}"
                                  if plan.model.is_moe else ""))
    head.add_row("quantization", (f"{Prequantized.from_record(sq).describe()} from "
                                  f"model.source's {sq['declared_in']}, planned as {plan.quant_algo}" if sq else
                                  f"{plan.quant_algo} ({plan.trtllm_quant_algo or 'unquantized'})")
                                 + f", KV cache {plan.kv_cache_quant_algo or plan.dtype}, dtype {plan.dtype}")
    head.add_row("parallelism", f"tp_size {plan.tp_size} x pp_size {plan.pp_size} = world_size {plan.world_size}")
    head.add_row("limits", ", ".join(f"{k} {v}" for k, v in plan.limits.as_dict().items()))
    if plan.admission is not None:
        head.add_row("admission", plan.admission.text())
    sp = plan.speculative
    if sp is not None:
        conc = sp.max_concurrency or "any number of"
        head.add_row("speculative", f"{sp.mode}, max_draft_len {sp.max_draft_len} ({sp.tokens_per_step} tokens per "
                                    f"request a step), drafting at up to {conc} requests in flight; draft "
                                    f"{sp.draft_model or '-'}: {sp.draft_source}")
    con.print(head)

    mem = Table(title="memory per rank (heaviest pipeline stage)", title_justify="left")
    mem.add_column("part")
    mem.add_column("bytes", justify="right")
    mem.add_column("size", justify="right")
    mem.add_column("note")
    for part, n in m.weights_breakdown.items():
        mem.add_row(f"  weights: {part}", f"{n:,}", human_bytes(n), "")
    mem.add_row("weights", f"{m.weights_bytes_per_rank:,}", human_bytes(m.weights_bytes_per_rank),
                "per PP rank: " + ", ".join(human_bytes(b) for b in m.weights_bytes_by_pp_rank))
    if m.draft_weights_bytes:
        mem.add_row("draft weights", f"{m.draft_weights_bytes:,}", human_bytes(m.draft_weights_bytes),
                    "speculative decoding's draft model")
    mem.add_row("activations", f"{m.activation_bytes:,}", human_bytes(m.activation_bytes),
                f"estimate from max_num_tokens {plan.limits.max_num_tokens}")
    if m.context_logits_bytes:
        mem.add_row("context logits", f"{m.context_logits_bytes:,}", human_bytes(m.context_logits_bytes),
                    f"limits.gather_context_logits: max_num_tokens {plan.limits.max_num_tokens} x vocab x 4 B, "
                    "beside the KV pool")
    if m.lora_cache_bytes:
        mem.add_row("LoRA cache", f"{m.lora_cache_bytes:,}", human_bytes(m.lora_cache_bytes),
                    f"lora.max_loras {plan.lora.max_loras} slots of rank {plan.lora.max_lora_rank}, before the KV pool")
    mem.add_row("runtime reserve", f"{m.reserve_bytes:,}", human_bytes(m.reserve_bytes), "CUDA context, workspaces")
    mem.add_row("KV pool", f"{kv.pool_bytes:,}", human_bytes(kv.pool_bytes), kv.pool_source)
    mem.add_row("total", f"{m.total_bytes:,}", human_bytes(m.total_bytes),
                f"of {human_bytes(m.device_bytes)} ({100 * m.total_bytes / m.device_bytes:.1f}%)")
    con.print(mem)

    kvt = Table(title="paged KV cache per rank", show_header=False, title_justify="left")
    kvt.add_column("key", style="bold")
    kvt.add_column("value")
    kvt.add_row("bytes per token", f"{kv.bytes_per_token:,} ({human_bytes(kv.bytes_per_token)}; "
                                   f"{kv.kv_heads_per_rank} KV head(s) per rank, {kv.dtype_bytes} B/element)")
    kvt.add_row("capacity", f"{kv.capacity_tokens:,} tokens in {kv.blocks:,} blocks of {kv.tokens_per_block}")
    kvt.add_row("max_seq_len sequences", f"{kv.max_seq_len_sequences:,} at once "
                                         f"({kv.blocks_per_max_seq} blocks each)")
    kvt.add_row(f"ISL {kv.workload_isl} + OSL {kv.workload_osl}",
                f"{kv.workload_sequences:,} sequences fit; {kv.workload_concurrency} in flight "
                f"(max_batch_size {plan.limits.max_batch_size}"
                + (f" on each of {plan.attention_dp_size} attention-DP ranks)" if plan.attention_dp_size > 1 else ")"))
    con.print(kvt)
    if plan.lora is not None:
        lt = Table(title=f"LoRA adapters (lora_task_id: what the Triton models take; name: what OpenAI clients send "
                         f"as model); host cache {human_bytes(plan.lora.host_cache_bytes)} "
                         f"(lora.max_cpu_loras {plan.lora.max_cpu_loras})", title_justify="left")
        for col in ("lora_task_id", "name", "rank", "scaling", "modules", "bytes per rank"):
            lt.add_column(col)
        for a in plan.lora.adapters:
            lt.add_row(str(a.task_id), a.name, str(a.rank), f"{a.scaling:g}", ",".join(a.target_modules),
                       human_bytes(a.bytes_per_rank))
        con.print(lt)

    if plan.plugins_apply:
        pt = Table(title="trtllm-build plugins", title_justify="left")
        pt.add_column("flag")
        pt.add_column("value")
        pt.add_column("reason")
        for p in plan.plugins:
            pt.add_row(p.flag + (" (implicit)" if p.implicit else ""), p.value, p.reason)
        con.print(pt)
    else:  # still in plan.json: what trtllm-build would get on the engine path
        con.print(f"trtllm-build plugins: none apply (runtime {plan.runtime} builds no TensorRT engine; plan.json "
                  "lists what the engine path would use)", highlight=False)
    if plan.runtime_settings:
        rt = Table(title=f"runtime settings ({plan.runtime}: transformers continuous batching), as "
                         "tensorrt_llm/config.pbtxt will hold them: limits.* and serving.* come from the build file, "
                         "the others are parameters there (edit a copy, serve it with `trtpipe serve --model-repo`)",
                   title_justify="left")
        wide = con.width >= 120  # narrower: the reasons follow the table, so no column is squeezed
        rt.add_column("setting", no_wrap=True)  # whole names: they are what a user searches config.pbtxt for
        rt.add_column("value", overflow="fold")
        if wide:
            rt.add_column("reason")
        for r in plan.runtime_settings:
            rt.add_row(r.name, r.value or '""', *([r.reason] if wide else []))
        con.print(rt)
        if not wide:
            for r in plan.runtime_settings:
                con.print(f"  [bold]{r.name}[/bold]: {r.reason}", highlight=False)
    render_performance(plan, con)
    for w in plan.warnings:
        con.print(f"[yellow]warning:[/yellow] {w}")


def render_performance(plan: Plan, con: Console) -> None:
    """The predicted TTFT / TPOT / throughput table (plan.performance), or why there is none."""
    perf = plan.performance
    if perf is None:
        return
    if not perf.available:
        con.print(f"predicted speed: none ({perf.reason})", highlight=False)
        return
    inp = perf.inputs
    roofline = perf.method == "roofline"
    title = (f"estimated speed on {perf.system} at ISL {perf.isl} / OSL {perf.osl}: {perf.source}" if roofline
             else f"predicted speed on {perf.system} at ISL {perf.isl} / OSL {perf.osl}")
    calibrated = any(p.output_tokens_per_s_calibrated is not None for b in perf.backends for p in b.points)
    tok = ("tok/s (aiconfigurator)", "tok/s (calibrated)") if calibrated else ("tok/s",)
    columns = ("framework", "conc", "TTFT ms", "TPOT ms", "latency s", *tok, "tok/s/GPU", "tok/s/user")
    rows: list[tuple] = []
    per_user = "tok/s/user is one stream's speed (1000 / TPOT), tok/s all streams' output over the whole request"
    if roofline:
        notes = [f"{perf.source}, because {perf.reason}: the roofline of the plan's bytes and FLOPs per step "
                 f"(builders/roofline.py) at {inp['memory_bandwidth_gbps']:g} GB/s x {inp['efficiency_bandwidth']:g} "
                 f"and {inp['tensor_tflops']:g} {inp['precision']} TFLOPS x {inp['efficiency_compute']:g}, tp "
                 f"{inp['tp_size']} x pp {inp['pp_size']}; mean steady state of a closed loop, not a percentile; "
                 f"{per_user}",
                 f"its stated error: {perf.stated_error}"]
    else:
        notes = [f"{perf.source}; inputs: gemm {inp.get('gemm_quant_mode')}, KV {inp.get('kvcache_quant_mode')}, "
                 f"tp {inp.get('tp_size')} x pp {inp.get('pp_size')}, ctx_tokens min(max_num_tokens "
                 f"{inp.get('ctx_tokens')}, concurrency x ISL) "
                 f"({'cached' if perf.cached else f'{perf.elapsed_s:.1f} s'}); {per_user}"]
    for b in perf.backends:
        label = f"{b.backend} (roofline)" if roofline else b.backend
        if not b.points:
            rows.append((label, *["-"] * (7 + calibrated)))
            notes.append(f"{b.backend}: no prediction from database {b.version} ({b.error})")
            continue
        if not roofline:
            share = "" if b.measured_share is None else \
                f", {100 * b.measured_share:.0f}% of the latency from measured kernels"
            notes.append(f"{b.backend}: database {b.version} ({b.database_mode.lower()}){share}")
        for i, p in enumerate(b.points):
            cal = [] if not calibrated else ["-" if p.output_tokens_per_s_calibrated is None
                                             else f"{p.output_tokens_per_s_calibrated:,.0f}"]
            rows.append((label if i == 0 else "", str(p.concurrency), f"{p.ttft_ms:.1f}", f"{p.tpot_ms:.2f}",
                         f"{p.request_latency_ms / 1000:.2f}", f"{p.output_tokens_per_s:,.0f}", *cal,
                         f"{p.output_tokens_per_s_per_gpu:,.0f}", f"{p.output_tokens_per_s_per_user:,.1f}"))
        if b.error:
            notes.append(f"{b.backend}: {b.error}")
        warn = next((p.kv_cache_warning for p in b.points if p.kv_cache_warning), None)
        if warn:
            notes.append(f"{b.backend}: aiconfigurator: {warn}")
    if perf.calibration:
        notes.append(f"trtllm: {perf.calibration}")
    if calibrated:
        notes.append("tok/s (calibrated) is the throughput to quote; TTFT, TPOT, latency, tok/s/GPU and tok/s/user "
                     "are aiconfigurator's, uncorrected")
    widths = [max([len(w) for w in col.split()] + [len(r[j]) for r in rows]) for j, col in enumerate(columns)]
    groups = [list(range(len(columns)))]
    if sum(w + 3 for w in widths) + 1 > con.width:  # too narrow for one table: latency, then throughput
        groups = [[0, 1, 2, 3, 4], [0, 1] + list(range(5, len(columns)))]
    tables = []
    for g, keep in enumerate(groups):
        t = Table(title=title if g == 0 else None, title_justify="left")
        for j in keep:  # numbers are never cut: each column at least as wide as its longest value
            t.add_column(columns[j], justify="left" if j == 0 else "right", no_wrap=j == 0, overflow="fold",
                         min_width=widths[j])
        for r in rows:
            t.add_row(*[r[j] for j in keep])
        tables.append(t)
    if [b.backend for b in perf.backends] == ["trtllm"] and not roofline:
        notes.append("vLLM and SGLang on the same GPUs: trtpipe plan --compare-frameworks")
    for t in tables:
        con.print(t)
    for n in notes:
        con.print(f"  {n}", highlight=False)
