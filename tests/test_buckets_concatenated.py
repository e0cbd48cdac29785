"""Mini-batches whose node types are concatenated in the graph (per-type maps, then ``torch.cat`` in
``to_homogeneous`` order, then layers over one ``edge_index`` of the concatenation) padded to buckets: each node type
padded in its own place, the real ids moved past the padded rows before them, the output cut back to each type's real
rows; outputs and all gradients match eager."""
import copy

import pytest
import torch
from torch_geometric.nn import GCNConv, RGCNConv

import gnn_inductor
from gnn_inductor import buckets
from gnn_inductor.testing import assert_close_to_reference, random_graph
from tests.buckets_cases import dynamo_graph

TYPES = ("paper", "author", "field")
RELATIONS = 3
# node counts per type of a stream of mini-batches; the first compiles at its own sizes, the others run padded
COUNTS = [(30, 40, 20), (35, 44, 25), (50, 60, 33), (38, 41, 29)]


class _Concatenated(torch.nn.Module):
    """A linear map per node type, the rows concatenated, then ``conv`` over the concatenation's edges."""

    def __init__(self, conv):
        super().__init__()
        self.project = torch.nn.ModuleDict({t: torch.nn.Linear(5, 8) for t in TYPES})
        self.conv = conv

    def forward(self, x_dict, edge_index, edge_type):
        x = torch.cat([self.project[t](x_dict[t]) for t in TYPES]).relu()
        if isinstance(self.conv, RGCNConv):
            return self.conv(x, edge_index, edge_type)
        return self.conv(x, edge_index)


def _batch(counts, step: int, device="cpu"):
    nodes = sum(counts)
    edge_index = random_graph(nodes, 3 * nodes, hub_degree=nodes // 3, seed=step)
    edge_type = torch.randint(0, RELATIONS, (edge_index.shape[1],), generator=torch.Generator().manual_seed(step))
    x_dict = {t: torch.randn(c, 5, generator=torch.Generator().manual_seed(10 * step + i))
              for i, (t, c) in enumerate(zip(TYPES, counts))}
    return {t: x.to(device) for t, x in x_dict.items()}, edge_index.to(device), edge_type.to(device)


@pytest.mark.parametrize("conv,device,cuda_graphs", [
    ("gcn", "cpu", False),
    ("rgcn", "cpu", False),
    pytest.param("rgcn", "cuda", True, marks=pytest.mark.cuda),
], ids=["gcn", "rgcn", "rgcn-cuda-graphs"])
def test_concatenated_node_types_run_padded_and_match_eager(conv, device, cuda_graphs):
    """Hubs, self loops, duplicates and isolated nodes over the concatenation; outputs and every gradient (the
    per-type inputs' too) against eager in float64. RGCNConv's relations run as one product per edge in the buckets."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _Concatenated(GCNConv(8, 4) if conv == "gcn" else RGCNConv(8, 4, RELATIONS)).to(device)
    exact = copy.deepcopy(model).double()
    compiled = torch.compile(model, backend="gnn_io", options={"buckets": "on", "cuda_graphs": cuda_graphs})
    for step, counts in enumerate(COUNTS):
        x_dict, edge_index, edge_type = _batch(counts, step, device)
        runs = {}
        for name, module, run in (("exact", exact, exact), ("eager", model, model), ("compiled", model, compiled)):
            dtype = torch.float64 if module is exact else torch.float32
            inputs = {t: x.to(dtype).requires_grad_() for t, x in x_dict.items()}
            if run is compiled and cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()
            out = run(inputs, edge_index, edge_type)
            out.square().sum().backward()
            runs[name] = [out.detach().clone()] + [inputs[t].grad for t in TYPES] + \
                [p.grad for p in module.parameters()]
            module.zero_grad(set_to_none=True)
        for i, (actual, expected, baseline) in enumerate(zip(runs["compiled"], runs["exact"], runs["eager"])):
            assert_close_to_reference(f"step {step}, {'output' if i == 0 else f'gradient {i}'}", actual, expected,
                                      baseline)
    (entry,) = [rw for r in gnn_inductor.rewrite_report.reports(compiled) for rw in r.rewrites
                if rw.pattern == "buckets"]
    assert entry.details["buckets"] and "N0 + N1 + N2 -> N0 + N1 + N2" in entry.details["sizes"][-1]
    if conv == "rgcn":
        assert entry.details["relation_segments"] == [RELATIONS]


def test_the_padding_moves_concatenated_ids_to_the_same_rows_and_cuts_them_back():
    """Each real edge's ids name, in the concatenation of the padded types, the rows they named before; the padded
    edges name padded rows of the last type; the output's real rows come back in order."""
    model = _Concatenated(GCNConv(8, 4))
    graph = dynamo_graph(model, [_batch(counts, step) for step, counts in enumerate(COUNTS[:2])])
    layout, why = buckets.layout_of(graph)
    assert why is None and layout.ends[layout.edge_inputs[0]] == (("N0", "N1", "N2"),) * 2
    x_dict, edge_index, edge_type = _batch(COUNTS[2], 7)
    rows_of = {f"N{i}": x_dict[t] for i, t in enumerate(TYPES)}  # the types in the graph's order
    sizes = {tag: x.shape[0] for tag, x in rows_of.items()} | {"E": edge_index.shape[1]}
    by_kind = {"rows": rows_of.get, "size": sizes.get, "edge_index": lambda tag: edge_index, "keep": lambda tag: None}
    args = [by_kind[kind](tag) for kind, tag in layout.kinds]
    counts = layout.sizes(args)
    assert counts == COUNTS[2] + (edge_index.shape[1],)
    padded = buckets.padded_for(counts, layout.slots)
    padded_args = layout.pad(args, counts, padded)
    real = torch.cat([x_dict[t] for t in TYPES])
    by_type = {layout.kinds[i][1]: padded_args[i] for i, (kind, _) in enumerate(layout.kinds) if kind == "rows"
               and layout.kinds[i][1].startswith("N")}
    rows = torch.cat([by_type[tag] for tag in ("N0", "N1", "N2")])
    moved = padded_args[layout.edge_inputs[0]]
    edges = edge_index.shape[1]
    assert torch.equal(rows[moved[:, :edges]], real[edge_index])
    last = sum(padded[:2]) + counts[2]
    assert bool((moved[:, edges:] >= last).all() and (moved[:, edges:] < sum(padded[:3])).all())
    (out,) = layout.trim((rows,), counts, padded)
    assert torch.equal(out, real)
