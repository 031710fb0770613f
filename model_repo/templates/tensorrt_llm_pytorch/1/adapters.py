# LoRA adapters of the portable `pytorch` runtime: every adapter of the build stays apart from the base weights
# (no merge), and one forward pass serves a batch that mixes them and the base model.
#
# Each adapted projection (an nn.Linear named in an adapter's tensors) is replaced by `LoraLinear`, which runs the
# base layer and then, for each adapter present in the batch, adds the low-rank update of that adapter's tokens
# only: y[rows] += (x[rows] @ A^T) @ (scaling * B)^T, with rows the packed-batch positions of its sequences (the
# gathered per-row products of S-LoRA / Punica, in plain torch). Which tokens belong to which adapter is set once per
# batch, at prepare time, by `Lora.batch_hook` (wrapping transformers' ContinuousBatchingIOs.prepare_batch_tensors:
# the packed batch is each scheduled request's query tokens in order, transformers 5.24 input_outputs.py), and read
# by every LoraLinear of the forward that follows (batching is synchronous: sampling.py).
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


class LoraLinear(torch.nn.Module):
    """A linear layer plus the low-rank updates of the adapters that adapt it, applied per packed-batch row."""

    def __init__(self, base, state):
        super().__init__()
        self.base = base
        self.state = state  # the shared Lora: which rows belong to which adapter in the current batch
        self.a = {}  # adapter index -> A [r, in]
        self.b = {}  # adapter index -> scaling * B [out, r]

    def forward(self, x):
        y = self.base(x)
        groups = self.state.groups
        if not groups:
            return y
        flat_x = x.reshape(-1, x.shape[-1])
        flat_y = y.reshape(-1, y.shape[-1])
        for index, rows in groups:
            a = self.a.get(index)
            if a is None:
                continue  # this adapter leaves this layer as it is
            if rows is None:  # the whole batch is this adapter's
                flat_y += (flat_x @ a.t()) @ self.b[index].t()
            else:
                flat_y.index_add_(0, rows, (flat_x.index_select(0, rows) @ a.t()) @ self.b[index].t())
        return flat_y.view_as(y)


class Lora:
    """The adapters of one model and the current batch's row groups.

    ``task_ids``: lora_task_id -> adapter index (1..n); ``groups``: [(adapter index, row indices or None for every
    row)] of the batch about to run (empty: base model only)."""

    def __init__(self, model, engine_dir, table, device, dtype):
        from safetensors.torch import load_file

        self.groups = []
        self.task_ids = {}
        self.names = {}
        self._local = threading.local()
        self.modules = {}
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
        """Set the batch's groups from ``per_request``: [(adapter index, query tokens)] in packed order."""
        groups, start, spans = {}, 0, []
        for index, n in per_request:
            if index:
                groups.setdefault(index, []).append((start, start + n))
            start += n
        out = []
        for index, ranges in groups.items():
            if len(ranges) == len(per_request) and not any(i == 0 for i, _ in per_request):
                out.append((index, None))  # one adapter for the whole batch: no gather
                continue
            rows = torch.cat([torch.arange(a, b) for a, b in ranges])
            device = next(iter(self.modules.values())).base.weight.device
            out.append((index, rows.to(device)))
        self.groups = out

    @contextlib.contextmanager
    def only(self, task_id):
        """Run the body (one forward pass outside the batch: a prompt's log probabilities) with every row on
        ``task_id``'s adapter; the batch's groups are restored after."""
        saved, index = self.groups, self.index(task_id)
        self.groups = [(index, None)] if index else []
        try:
            yield
        finally:
            self.groups = saved

    def batch_hook(self, io, adapter_of):
        """Wrap ``io.prepare_batch_tensors`` (transformers' ContinuousBatchingIOs) so that each batch it prepares sets
        the groups first; ``adapter_of(state)`` gives a request state's adapter index."""
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
            lora.groups = []  # a forward outside the batches (a prompt's log probs) runs on the base unless told

    manager._generation_step = step_then_clear
    return lora
