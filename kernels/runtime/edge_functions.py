"""Registry of edge functions: the per-edge math (messages, attention scores) cut out of a model.

The rewrite pass turns the pointwise chain between a gather and a scatter into a small
``torch.fx.GraphModule`` whose inputs are per-edge values (see ``kernels/runtime/roles.py`` for the
roles) and registers it here under a content key. The ``torch.ops.gnn_io`` ops take that key as
a string argument, so the graph handed to Inductor holds only plain op arguments; the CPU path
evaluates the function and the GPU kernels generate it into their code.
"""
from __future__ import annotations

import hashlib

import torch

_REGISTRY: dict[str, torch.fx.GraphModule] = {}


def _content(fn: torch.fx.GraphModule) -> str:
    """``fn``'s graph with its values numbered in order: the same math cut from differently named nodes (two
    aggregations of one message) reads the same, so it gets the same key."""
    number = {node: f"v{i}" for i, node in enumerate(fn.graph.nodes)}

    def target(node) -> str:
        if node.op == "placeholder":  # an argument, known by its position
            return ""
        if isinstance(node.target, (str, torch._ops.OpOverload)):
            return str(node.target)
        return f"{getattr(node.target, '__module__', '')}.{getattr(node.target, '__qualname__', node.target)}"
    return "\n".join(f"{number[node]} = {node.op} {target(node)} "
                     f"{torch.fx.node.map_arg((node.args, node.kwargs), number.__getitem__)!r}"
                     for node in fn.graph.nodes)


def register(fn: torch.fx.GraphModule) -> str:
    """Store ``fn`` and return its key (a hash of its graph, names aside, and tensor constants)."""
    digest = hashlib.sha1(_content(fn).encode())
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
