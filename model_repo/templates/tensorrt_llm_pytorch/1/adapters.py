# LoRA adapters of the portable `pytorch` runtime: every adapter of the build stays apart from the base weights
# (no merge), and one forward pass serves a batch that mixes them and the base model.
#
# Each adapted projection (an nn.Linear named in an adapter's tensors) is replaced by `LoraLinear`, which runs the
# base layer and then adds each token's own adapter update. A batch of one adapter adds (x @ A^T) @ (scaling * B)^T;
# a batch that mixes adapters runs every adapter of the layer at once and keeps each token's own: with A_cat
# [L * r, in] (the L adapters' A stacked, each padded to the largest rank r with zeros) and B_cat [out, L * r],
# y += ((x @ A_cat^T) viewed [tokens, L, r] * mask [tokens, L, 1]) @ B_cat^T, where mask is one-hot on the token's
# adapter (all zero for the base). Three tensor ops per layer whatever the mix, no gather or scatter (per-adapter
# gathers cost four ops per adapter per layer: +111% TPOT with two adapters on 2 CPU cores, docs/benchmarks/lora.md);
# the price is L x r columns computed for every token. Which tokens belong to which adapter is set once per batch,
# at prepare time, by `Lora.batch_hook` (wrapping transformers' ContinuousBatchingIOs.prepare_batch_tensors: the
# packed batch is each scheduled request's query tokens in order, transformers 5.24 input_outputs.py), and read by
# every LoraLinear of the forward that follows (batching is synchronous: sampling.py). For a few rows (decode) the
# low-rank products run on one CPU thread: waking OpenMP's threads costs more than such a product (measured: 30 us
# single-threaded against 200 us on two threads for 4 rows of a 576-wide layer).
#
# The adapters come from the engine folder's lora/adapters.json ([{name, task_id, path, rank, scaling}]; path
# relative to the engine folder) and each PEFT folder's adapter_model.safetensors (lora_A [r, in], lora_B [out, r],
# PEFT 0.21 tuners/lora/layer.py; the scaling, alpha / r or alpha / sqrt(r) with rsLoRA, folded into B here).
# Pure torch + safetensors (no Triton imports), so it is unit-tested without a server.

from __future__ import annotations

import contextlib
import json
import os
import threading

import torch

TABLE = os.path.join("lora", "adapters.json")
"""The adapter table inside the engine folder."""

_SUFFIXES = (".lora_A.weight", ".lora_B.weight")


def read_table(engine_dir):
    """The engine's adapters, ``[{"name", "task_id", "path", "rank", "scaling"}, ...]`` ([] without any)."""
    path = os.path.join(engine_dir, TABLE)
    if not os.path.isfile(path):
        return []
    with open(path) as fh:
        return json.load(fh)


SMALL_ROWS = 64
"""At most this many rows: the low-rank products run on one CPU thread (see the top of this file)."""


class LoraLinear(torch.nn.Module):
    """A linear layer plus the low-rank updates of the adapters that adapt it, each applied to its own tokens."""

    def __init__(self, base, state):
        super().__init__()
        self.base = base
        self.state = state  # the shared Lora: the current batch's adapter of every token
        self.a = {}  # adapter index -> A [r, in]
        self.b = {}  # adapter index -> scaling * B [out, r]
        self.a_cat = self.b_cat = None  # every adapter at once (finish())

    def finish(self, count, rank):
        """Stack the ``count`` adapters (indices 1..count; absent ones zero) padded to ``rank``: A_cat [count * rank,
        in], B_cat [out, count * rank]."""
        w = self.base.weight
        a_cat = torch.zeros(count * rank, w.shape[1], dtype=w.dtype, device=w.device)
        b_cat = torch.zeros(w.shape[0], count * rank, dtype=w.dtype, device=w.device)
        for index, a in list(self.a.items()):
            lo, hi = (index - 1) * rank, (index - 1) * rank + a.shape[0]
            a_cat[lo:hi] = a
            b_cat[:, lo:hi] = self.b[index]
            self.a[index], self.b[index] = a_cat[lo:hi], b_cat[:, lo:hi]  # views: each adapter is held once
        self.a_cat, self.b_cat = a_cat, b_cat

    def forward(self, x):
        y = self.base(x)
        state = self.state
        if state.single is None and state.mask is None:
            return y  # the base model only
        flat_x = x.reshape(-1, x.shape[-1])
        flat_y = y.reshape(-1, y.shape[-1])
        rows = flat_x.shape[0]
        few = rows <= SMALL_ROWS and state.threads > 1
        if few:
            torch.set_num_threads(1)
        try:
            if state.single is not None:
                a = self.a.get(state.single)
                if a is not None:
                    flat_y.addmm_(flat_x @ a.t(), self.b[state.single].t())
            else:
                xa = (flat_x @ self.a_cat.t()).view(rows, state.count, state.rank) * state.mask_of(rows)
                flat_y.addmm_(xa.view(rows, -1), self.b_cat.t())
        finally:
            if few:
                torch.set_num_threads(state.threads)
        return flat_y.view_as(y)


class Lora:
    """The adapters of one model and the current batch's adapter of every token.

    ``task_ids``: lora_task_id -> adapter index (1..n); for the batch about to run, ``single``: the one adapter
    index of every token, or ``mask``: [tokens, n, 1] one-hot of each token's adapter (zero for the base); both None:
    the base model only."""

    def __init__(self, model, engine_dir, table, device, dtype):
        from safetensors.torch import load_file

        self.single = self.mask = None
        self.task_ids = {}
        self.names = {}
        self.modules = {}
        self.count = len(table)
        self.rank = max(int(entry["rank"]) for entry in table)
        self.threads = torch.get_num_threads()
        self.device, self.dtype = device, dtype
        for index, entry in enumerate(table, start=1):
            self.task_ids[int(entry["task_id"])] = index
            self.names[int(entry["task_id"])] = entry["name"]
            tensors = load_file(os.path.join(engine_dir, entry["path"], "adapter_model.safetensors"))
            scaling = float(entry["scaling"])
            for key, value in tensors.items():
                if not key.endswith(_SUFFIXES[0]):
                    continue
                stem = key[: -len(_SUFFIXES[0])]
                name = stem[len("base_model.model."):] if stem.startswith("base_model.model.") else stem
                layer = self._wrap(model, name)
                layer.a[index] = value.to(device=device, dtype=dtype).contiguous()
                layer.b[index] = (tensors[stem + _SUFFIXES[1]].float() * scaling).to(device=device,
                                                                                       dtype=dtype).contiguous()
        for layer in self.modules.values():
            layer.finish(self.count, self.rank)

    def _wrap(self, model, name):
        layer = self.modules.get(name)
        if layer is None:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            base = getattr(parent, child)
            if not isinstance(base, torch.nn.Linear):
                raise ValueError(f"LoRA tensor for {name}: a {type(base).__name__}, not a linear layer")
            layer = self.modules[name] = LoraLinear(base, self)
            setattr(parent, child, layer)
        return layer

    def index(self, task_id):
        """The adapter index of ``task_id`` (0: the base model). Raises KeyError for a task id not served."""
        task_id = int(task_id or 0)
        return 0 if task_id == 0 else self.task_ids[task_id]

    def set_rows(self, per_request):
        """Set the batch's adapters from ``per_request``: [(adapter index, query tokens)] in packed order."""
        used = {index for index, _ in per_request}
        self.single = self.mask = None
        if used == {0}:
            return
        if len(used) == 1:
            self.single = used.pop()
            return
        index = torch.tensor([i for i, n in per_request for _ in range(n)], dtype=torch.long)
        onehot = torch.zeros(len(index), self.count + 1, dtype=self.dtype)
        onehot[torch.arange(len(index)), index] = 1
        self.mask = onehot[:, 1:].unsqueeze(-1).to(self.device)

    def mask_of(self, rows):
        """The batch's mask for ``rows`` rows (padding rows, past the batch's tokens, get no adapter)."""
        if self.mask.shape[0] < rows:
            pad = torch.zeros(rows - self.mask.shape[0], self.count, 1, dtype=self.mask.dtype, device=self.device)
            self.mask = torch.cat([self.mask, pad])
        return self.mask[:rows]

    def clear(self):
        """No adapter until the next batch sets them."""
        self.single = self.mask = None

    @contextlib.contextmanager
    def only(self, task_id):
        """Run the body (one forward pass outside the batch: a prompt's log probabilities) with every row on
        ``task_id``'s adapter; the batch's adapters are restored after."""
        saved, index = (self.single, self.mask), self.index(task_id)
        self.single, self.mask = (index or None), None
        try:
            yield
        finally:
            self.single, self.mask = saved

    def batch_hook(self, io, adapter_of):
        """Wrap ``io.prepare_batch_tensors`` (transformers' ContinuousBatchingIOs) so that each batch it prepares sets
        the adapters first; ``adapter_of(state)`` gives a request state's adapter index."""
        prepare = io.prepare_batch_tensors

        def prepare_with_lora(requests_in_batch, *args, **kwargs):
            self.set_rows([(adapter_of(fs.state), fs.query_length) for fs in requests_in_batch])
            return prepare(requests_in_batch, *args, **kwargs)

        io.prepare_batch_tensors = prepare_with_lora


def install(manager, engine_dir, table, adapter_of):
    """Load the engine's adapters into ``manager.model`` (replacing the adapted linear layers), hook the batch
    preparation of the batch processor the manager creates, and clear the groups after each generation step. Returns the :class:`Lora`, or None without adapters.

    ``table``: :func:`read_table`'s list; ``adapter_of(state)``: a request state's lora_task_id (0: base)."""
    if not table:
        return None
    model = manager.model
    lora = Lora(model, engine_dir, table, model.device, model.dtype)
    create = manager._create_batch_processor

    def create_with_lora():
        processor = create()
        io = processor.inputs_and_outputs
        if not getattr(io, "_trtpipe_lora", False):
            lora.batch_hook(io, lambda state: lora.index(adapter_of(state)))
            io._trtpipe_lora = True
        return processor

    manager._create_batch_processor = create_with_lora
    step = manager._generation_step

    def step_then_clear():
        try:
            step()
        finally:
            lora.clear()  # a forward outside the batches (a prompt's log probs) runs on the base unless told

    manager._generation_step = step_then_clear
    return lora
