"""Helpers shared by the bucket tests: a model's Dynamo graph of changing sizes, and what the padding analysis says
of it."""
from typing import Optional

import torch

from gnn_inductor import buckets
from gnn_inductor.canonical import canonicalize


def dynamo_graph(model, calls: list) -> torch.fx.GraphModule:
    """``model``'s graph as Dynamo captures it (no compile) over ``calls`` (argument tuples of changing sizes): the
    last one, whose sizes are symbols."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=capture, dynamic=True)
    for args in calls:
        compiled(*args)
    torch._dynamo.reset()
    return graphs[-1]


def why_not_padded(gm: torch.fx.GraphModule) -> Optional[str]:
    """Why the buckets decline ``gm`` (its layout, then its ATen ops), or None where they pad it."""
    layout, why = buckets.layout_of(gm)
    if layout is not None:
        why = buckets.why_unsafe(canonicalize(buckets.copy_module(gm)), layout)
    return why
