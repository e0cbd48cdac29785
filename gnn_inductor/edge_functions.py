"""Registry of edge functions: the per-edge math (messages, attention scores) cut out of a model.

The rewrite pass turns the pointwise chain between a gather and a scatter into a small
``torch.fx.GraphModule`` whose inputs are per-edge values (see ``kernels/_common.py`` for the
roles) and registers it here under a content key. The ``torch.ops.gnn_io`` ops take that key as
a string argument, so the graph handed to Inductor holds only plain op arguments; the CPU path
evaluates the function and the GPU kernels generate it into their code.
"""
from __future__ import annotations

import hashlib

import torch

_REGISTRY: dict[str, torch.fx.GraphModule] = {}


def register(fn: torch.fx.GraphModule) -> str:
    """Store ``fn`` and return its key (a hash of its code and tensor constants)."""
    digest = hashlib.sha1(fn.code.encode())
    for name, buf in sorted(fn.named_buffers()) + sorted(fn.named_parameters()):
        digest.update(name.encode())
        digest.update(repr((buf.dtype, tuple(buf.shape))).encode())
        digest.update(buf.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    for name, value in sorted(vars(fn).items()):
        if name.startswith("_tensor_constant") and isinstance(value, torch.Tensor):
            digest.update(value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    key = "ef_" + digest.hexdigest()[:16]
    _REGISTRY.setdefault(key, fn)
    return key


def lookup(key: str) -> torch.fx.GraphModule:
    try:
        return _REGISTRY[key]
    except KeyError:
        raise KeyError(
            f"edge function {key!r} is not registered in this process; gnn_io ops are created by "
            "the gnn_io backend while it compiles the model, so compile the model in this process"
        ) from None


def source(key: str) -> str:
    """Readable code of a registered edge function (for the report)."""
    return lookup(key).code.strip()
