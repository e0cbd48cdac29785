"""Shape buckets for heterogeneous mini-batches (gnn_inductor/buckets.py, gnn_inductor/buckets_layout.py): which node
type each edge_index row indexes, found in the graph, the padding per node type and edge set, and compiled hetero
models over changing batches against eager, forward and gradients."""
import pytest
import torch
from torch._dynamo.utils import counters
from torch_geometric.nn import GAT, GATConv, GraphSAGE, HeteroConv, SAGEConv, TransformerConv, to_hetero

import gnn_inductor
from gnn_inductor import buckets
from gnn_inductor.canonical import canonicalize
from gnn_inductor.testing import random_graph, tolerance
from benchmarks.hetero import HeteroStack

FEATURES = 8
# to_hetero's metadata: a relation, its reverse and one within a node type
METADATA = (["paper", "author"], [("author", "writes", "paper"), ("paper", "rev_writes", "author"),
                                  ("paper", "cites", "paper")])
# HeteroConv's: three node types, four edge types (one node type only a destination)
RELATIONS = METADATA[1] + [("paper", "has_topic", "field")]
ISOLATED = 2  # the last nodes of each type have no edges


def hetero_batch(nodes: dict, edges: dict, seed: int, device: str = "cpu") -> tuple:
    """``(x_dict, edge_index_dict)`` of a sampled-looking batch: ``nodes`` per type (the last :data:`ISOLATED` of
    each without edges), ``edges`` per edge type (0: an empty edge set), each with three duplicated edges and a hub
    (node 0 of the destination type gets a third of its type's count more), and self loops within a type."""
    generator = torch.Generator().manual_seed(seed)
    x = {t: torch.randn(n, FEATURES, generator=generator) for t, n in nodes.items()}
    edge_index = {}
    for (src, rel, dst), count in edges.items():
        if count == 0:
            edge_index[src, rel, dst] = torch.empty(2, 0, dtype=torch.long)
            continue
        ends = [torch.randint(0, nodes[t] - ISOLATED, (count,), generator=generator) for t in (src, dst)]
        hub = nodes[dst] // 3
        parts = [torch.stack(ends), torch.stack([torch.randint(0, nodes[src] - ISOLATED, (hub,), generator=generator),
                                                 torch.zeros(hub, dtype=torch.long)])]
        if src == dst:
            loops = torch.arange(0, nodes[src] - ISOLATED, 5)
            parts.append(torch.stack([loops, loops]))
        parts.append(parts[0][:, :3])
        edge_index[src, rel, dst] = torch.cat(parts, dim=1)
    return {t: v.to(device) for t, v in x.items()}, {e: v.to(device) for e, v in edge_index.items()}


def _sizes(paper, author, field=None):
    nodes = {"paper": paper, "author": author} | ({"field": field} if field else {})
    return nodes


# the to_hetero stream (every batch traced with symbolic sizes): first a batch with as many papers as authors, so
# that Dynamo gives both counts one symbol, and no cites edges (an empty edge set, which Dynamo fixes at 0); then
# changing sizes, and last a batch of sizes seen before
TO_HETERO_STREAM = [
    (_sizes(50, 50), {METADATA[1][0]: 90, METADATA[1][1]: 80, METADATA[1][2]: 0}),
    (_sizes(55, 45), {METADATA[1][0]: 120, METADATA[1][1]: 100, METADATA[1][2]: 70}),
    (_sizes(61, 70), {METADATA[1][0]: 140, METADATA[1][1]: 90, METADATA[1][2]: 40}),
    (_sizes(48, 66), {METADATA[1][0]: 110, METADATA[1][1]: 130, METADATA[1][2]: 50}),
    (_sizes(55, 45), {METADATA[1][0]: 120, METADATA[1][1]: 100, METADATA[1][2]: 70}),
]


def _hetero_conv(inputs: int, outputs: int, relations=RELATIONS) -> HeteroConv:
    """SAGEConv on writes and has_topic, GATConv on cites (within one type, self loops added after PyG removes
    those there: an edge filter) and a bipartite GATConv (no self loops) on rev_writes; of ``relations``."""
    convs = {
        RELATIONS[0]: SAGEConv(inputs, outputs),
        RELATIONS[1]: GATConv((inputs, inputs), outputs, heads=1, add_self_loops=False),
        RELATIONS[2]: GATConv(inputs, outputs, heads=1),
        RELATIONS[3]: SAGEConv(inputs, outputs),
    }
    return HeteroConv({r: convs[r] for r in relations}, aggr="sum")


def _run(model, stream, edge_dims=None, device="cpu"):
    """Eager and compiled (buckets on, every batch traced with symbolic sizes) over ``stream``: every node type's
    output and all gradients checked (of the features, of the edge attributes of the edge types in ``edge_dims``,
    a third input, and of the parameters). Returns the buckets' report entries and, before the last batch, Dynamo's
    graph count and the buckets compiled. On the CPU the rewrites are off: the buckets compile Inductor's own code
    either way, and the graph of changing sizes (compiled too, as the fallback) compiles faster without them. On
    CUDA the model compiles as users run mini-batches there, ``mode="reduce-overhead"`` (buckets, CUDA graphs)."""
    if device == "cuda":
        compiled = torch.compile(model, backend="gnn_io", mode="reduce-overhead", dynamic=True)
    else:
        compiled = torch.compile(model, backend="gnn_io", options={"buckets": "on", "cpu_rewrite": False},
                                 dynamic=True)
    before = None
    for i, (nodes, edges) in enumerate(stream):
        if i == len(stream) - 1:
            before = counters["stats"]["unique_graphs"], _buckets_compiled(model)
        x, edge_index = hetero_batch(nodes, edges, seed=i, device=device)
        leaves = {t: v.requires_grad_() for t, v in x.items()}
        args = (leaves, edge_index)
        if edge_dims:
            attr = {e: torch.randn(edge_index[e].shape[1], d, device=device, requires_grad=True)
                    for e, d in edge_dims.items()}
            leaves, args = {**leaves, **attr}, args + (attr,)
        expected = model(*args)
        sum(v.square().sum() for v in expected.values()).backward()
        want = [v.grad for v in leaves.values()] + [p.grad for p in model.parameters()]
        model.zero_grad()
        for v in leaves.values():
            v.grad = None
        actual = compiled(*args)
        assert set(actual) == set(expected)
        sum(v.square().sum() for v in actual.values()).backward()
        for t in expected:
            torch.testing.assert_close(actual[t], expected[t], **tolerance(torch.float32, "layer"))
        got = [v.grad for v in leaves.values()] + [p.grad for p in model.parameters()]
        assert all(g is not None for g in got)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, **tolerance(torch.float32, "layer"))
        model.zero_grad()
    return _bucket_entries(model), before


def _bucket_entries(model) -> list:
    return [rw for r in gnn_inductor.rewrite_report.reports(model) for rw in r.rewrites if rw.pattern == "buckets"]


def _buckets_compiled(model) -> int:
    return sum(len(entry.details["buckets"]) for entry in _bucket_entries(model))


def _compiled_entry(entries, width: int, nodes: list):
    """The one report entry that compiled buckets of ``width`` sizes whose node counts are ``nodes``: per count, the
    feature inputs it counts."""
    def counted(entry) -> list:
        return [set(size.split(": ", 1)[1].split(", ")) for size in entry.details["sizes"][:len(nodes)]]
    found = [e for e in entries if e.details["buckets"] and len(e.details["sizes"]) == width
             and counted(e) == list(map(set, nodes))]
    assert len(found) == 1, [e.details for e in entries]
    assert all(len(key) == width for key in found[0].details["buckets"])
    return found[0]


def _named_ends(entry) -> dict:
    """edge_index input -> the feature inputs of its source and destination node types, as the report names them."""
    nodes, ends = {}, {}
    for size in entry.details["sizes"]:
        tag, what = size.split(": ", 1)
        if tag.startswith("N"):
            nodes[tag] = what
        else:
            name, rows = what.rsplit(" (", 1)
            ends[name] = tuple(nodes[t] for t in rows.rstrip(")").split(" -> "))
    return ends


def test_to_hetero_graphsage_over_changing_batches_runs_padded_and_matches_eager():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = to_hetero(GraphSAGE(FEATURES, 16, num_layers=2, out_channels=4), METADATA, aggr="sum")
    entries, (graphs, compiled) = _run(model, TO_HETERO_STREAM)
    # the first batch: papers and authors one count (one symbol), two edge counts (cites a fixed empty input)
    shared = _compiled_entry(entries, 3, [["l_x_paper_", "l_x_author_"]])
    assert set(_named_ends(shared)) == {"l_edge_index_author_writes_paper_", "l_edge_index_paper_rev_writes_author_"}
    # then all five counts apart, each edge set's rows on their node types
    apart = _compiled_entry(entries, 5, [["l_x_paper_"], ["l_x_author_"]])
    assert _named_ends(apart) == {"l_edge_index_author_writes_paper_": ("l_x_author_", "l_x_paper_"),
                                  "l_edge_index_paper_rev_writes_author_": ("l_x_paper_", "l_x_author_"),
                                  "l_edge_index_paper_cites_paper_": ("l_x_paper_", "l_x_paper_")}
    # the last batch repeats the second: no new Dynamo graph and no new bucket compile
    assert counters["stats"]["unique_graphs"] == graphs and _buckets_compiled(model) == compiled
    assert not [m for r in gnn_inductor.rewrite_report.reports(model) for m in r.near_misses
                if m.pattern == "buckets"]


# the HeteroConv streams: changing sizes, then a batch of sizes seen before; the larger one over three node types
# starts with as many papers as authors and has no cites edges in its third batch
HETERO_CONV_STREAM = [
    (_sizes(45, 52), {METADATA[1][0]: 100, METADATA[1][1]: 90, METADATA[1][2]: 60}),
    (_sizes(57, 44), {METADATA[1][0]: 120, METADATA[1][1]: 100, METADATA[1][2]: 70}),
    (_sizes(63, 71), {METADATA[1][0]: 140, METADATA[1][1]: 85, METADATA[1][2]: 75}),
    (_sizes(57, 44), {METADATA[1][0]: 120, METADATA[1][1]: 100, METADATA[1][2]: 70}),
]
HETERO_CONV_STREAM_3 = [
    (_sizes(50, 50, 20), {RELATIONS[0]: 90, RELATIONS[1]: 80, RELATIONS[2]: 60, RELATIONS[3]: 40}),
    (_sizes(57, 44, 23), {RELATIONS[0]: 120, RELATIONS[1]: 100, RELATIONS[2]: 70, RELATIONS[3]: 50}),
    (_sizes(63, 71, 18), {RELATIONS[0]: 140, RELATIONS[1]: 90, RELATIONS[2]: 0, RELATIONS[3]: 45}),
    (_sizes(48, 66, 25), {RELATIONS[0]: 110, RELATIONS[1]: 130, RELATIONS[2]: 50, RELATIONS[3]: 60}),
    (_sizes(57, 44, 23), {RELATIONS[0]: 120, RELATIONS[1]: 100, RELATIONS[2]: 70, RELATIONS[3]: 50}),
]


def test_hetero_conv_of_sage_and_gat_over_changing_batches_runs_padded_and_matches_eager():
    """One HeteroConv layer: SAGEConv, a bipartite GATConv and a GATConv within one type whose self-loop filter
    keeps every edge slot at fixed sizes, its dropped edges sent to padded papers."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _hetero_conv(FEATURES, 4, METADATA[1])
    entries, (graphs, compiled) = _run(model, HETERO_CONV_STREAM)
    papers, authors = "l_args_dict_0_paper_", "l_args_dict_0_author_"
    entry = _compiled_entry(entries, 5, [[authors], [papers]])
    assert _named_ends(entry) == {"l_args_dict_1_author_writes_paper_": (authors, papers),
                                  "l_args_dict_1_paper_rev_writes_author_": (papers, authors),
                                  "l_args_dict_1_paper_cites_paper_": (papers, papers)}
    assert entry.details["edge_filters_at_fixed_size"] == 1, entry.details
    assert counters["stats"]["unique_graphs"] == graphs and _buckets_compiled(model) == compiled
    assert not [m for r in gnn_inductor.rewrite_report.reports(model) for m in r.near_misses
                if m.pattern == "buckets"]


@pytest.mark.cuda
@pytest.mark.parametrize("model_name", ["to_hetero_sage", "hetero_conv", "to_hetero_gat", "edge_attributes"])
def test_hetero_models_over_changing_batches_under_cuda_graphs_match_eager(model_name):
    """On CUDA under ``mode="reduce-overhead"``: every batch padded to a bucket replayed as a CUDA graph, outputs and
    all gradients against eager, and the repeated batch neither traced nor compiled again."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    stream, edge_dims = (HETERO_CONV_STREAM, None) if model_name == "hetero_conv" else (TO_HETERO_STREAM, None)
    if model_name == "to_hetero_sage":
        model = to_hetero(GraphSAGE(FEATURES, 16, num_layers=2, out_channels=4), METADATA, aggr="sum")
    elif model_name == "to_hetero_gat":
        model = to_hetero(GAT(FEATURES, 8, num_layers=2, out_channels=4, heads=2, add_self_loops=False), METADATA,
                          aggr="sum")
    elif model_name == "hetero_conv":
        model = _hetero_conv(FEATURES, 4, METADATA[1])
    else:
        model, stream = _WithEdgeAttributes(), HETERO_CONV_STREAM
        edge_dims = {METADATA[1][0]: 3, METADATA[1][2]: 3}
    entries, (graphs, compiled) = _run(model.cuda(), stream, edge_dims=edge_dims, device="cuda")
    misses = [m.reason for r in gnn_inductor.rewrite_report.reports(model) for m in r.near_misses
              if m.pattern == "buckets"]
    assert _buckets_compiled(model) >= 1 and not misses, ([e.details for e in entries], misses)
    assert counters["stats"]["unique_graphs"] == graphs and _buckets_compiled(model) == compiled


def test_float_attributes_read_from_tensors_are_fixed_in_each_bucket():
    """GATConv's ``negative_slope`` and ``dropout`` reach the graph as 0-d tensors read by ``.item()``; a bucket's
    compile at fixed sizes takes their values (part of its key), where a fresh symbol for them could not be checked
    by dropout's range test and the compile failed (the CUDA-graph path on CUDA; here its settings on the CPU)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _hetero_conv(FEATURES, 4, METADATA[1])
    compiled = torch.compile(model, backend="gnn_io", dynamic=True,
                             options={"buckets": "on", "cpu_rewrite": False, "cuda_graphs": True, "strict": True})
    for i, (nodes, edges) in enumerate(HETERO_CONV_STREAM[:2]):
        x, edge_index = hetero_batch(nodes, edges, seed=i)
        expected, actual = model(x, edge_index), compiled(x, edge_index)
        for t in expected:
            torch.testing.assert_close(actual[t], expected[t], **tolerance(torch.float32, "layer"))
    assert _buckets_compiled(model) >= 1
    scalars = [e.details.get("fixed_numbers") for e in _bucket_entries(model)]
    assert any(scalars), scalars


@pytest.mark.slow
def test_two_hetero_conv_layers_over_three_node_types_match_eager():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = HeteroStack(_hetero_conv(FEATURES, 16), _hetero_conv(16, 4))
    entries, (graphs, compiled) = _run(model, HETERO_CONV_STREAM_3)
    papers, authors, fields = "l_x_dict_paper_", "l_x_dict_author_", "l_x_dict_field_"
    shared = _compiled_entry(entries, 6, [[authors, papers], [fields]])  # papers and authors one count
    assert shared.details["edge_filters_at_fixed_size"] == 2, shared.details
    _compiled_entry(entries, 6, [[authors], [papers], [fields]])  # the batch without cites edges
    apart = _compiled_entry(entries, 7, [[authors], [papers], [fields]])
    assert _named_ends(apart)["l_edge_index_dict_paper_has_topic_field_"] == (papers, fields)
    assert counters["stats"]["unique_graphs"] == graphs and _buckets_compiled(model) == compiled


@pytest.mark.slow
def test_to_hetero_gat_over_changing_batches_matches_eager():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = to_hetero(GAT(FEATURES, 8, num_layers=2, out_channels=4, heads=2, add_self_loops=False), METADATA,
                      aggr="sum")
    entries, (graphs, compiled) = _run(model, TO_HETERO_STREAM)
    _compiled_entry(entries, 5, [["l_x_paper_"], ["l_x_author_"]])
    assert counters["stats"]["unique_graphs"] == graphs and _buckets_compiled(model) == compiled


class _WithEdgeAttributes(torch.nn.Module):
    """GATConv with edge features on writes (bipartite) and on cites (whose self-loop filter keeps the attribute's
    rows and whose added self loops get filled attributes), SAGEConv on rev_writes."""

    def __init__(self):
        super().__init__()
        self.conv = HeteroConv({METADATA[1][0]: GATConv((FEATURES, FEATURES), 4, edge_dim=3, add_self_loops=False),
                                METADATA[1][1]: SAGEConv(FEATURES, 4),
                                METADATA[1][2]: GATConv(FEATURES, 4, edge_dim=3)}, aggr="sum")

    def forward(self, x_dict, edge_index_dict, edge_attr_dict):
        return self.conv(x_dict, edge_index_dict, edge_attr_dict=edge_attr_dict)


@pytest.mark.slow
def test_edge_attributes_per_edge_set_are_padded_with_their_edges():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _WithEdgeAttributes()
    entries, (graphs, compiled) = _run(model, HETERO_CONV_STREAM, edge_dims={METADATA[1][0]: 3, METADATA[1][2]: 3})
    entry = _compiled_entry(entries, 5, [["l_x_dict_author_"], ["l_x_dict_paper_"]])
    assert entry.details["edge_filters_at_fixed_size"] == 2, entry.details  # cites' edge_index and its attribute
    assert counters["stats"]["unique_graphs"] == graphs and _buckets_compiled(model) == compiled


# ---- the layout: which node type each edge_index row indexes ---------------------------------------------------------

def _captured(model, *args):
    """``model``'s graph as Dynamo captures it for ``args`` with symbolic sizes (no compile)."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=capture, dynamic=True)(*args)
    torch._dynamo.reset()
    return graphs[-1]


def _dynamo_graph(model, nodes: dict, edges: dict):
    return _captured(model, *hetero_batch(nodes, edges, seed=0))


def _why_not_padded(gm):
    layout, why = buckets.layout_of(gm)
    return why if layout is None else buckets.why_unsafe(canonicalize(buckets.copy_module(gm)), layout)


def _rows_by_name(layout) -> dict:
    """edge_index input name -> the feature inputs its rows 0 and 1 index."""
    features = {tag: layout.names[i] for i, (kind, tag) in enumerate(layout.kinds) if kind == "rows"}
    return {layout.names[i]: tuple(features[t] for t in layout.ends[i]) for i in layout.edge_inputs}


TWO_TYPES = (_sizes(40, 50), {METADATA[1][0]: 90, METADATA[1][1]: 80, METADATA[1][2]: 60})


def test_the_rows_of_each_edge_set_map_to_their_node_types_in_a_to_hetero_graph():
    torch.manual_seed(0)
    model = to_hetero(GraphSAGE(FEATURES, 16, num_layers=2, out_channels=4), METADATA, aggr="sum")
    layout, why = buckets.layout_of(_dynamo_graph(model, *TWO_TYPES))
    assert why is None
    assert _rows_by_name(layout) == {
        "l_edge_index_author_writes_paper_": ("l_x_author_", "l_x_paper_"),
        "l_edge_index_paper_rev_writes_author_": ("l_x_paper_", "l_x_author_"),
        "l_edge_index_paper_cites_paper_": ("l_x_paper_", "l_x_paper_"),
    }
    # the padded edges of writes and cites end on papers, those of rev_writes on authors; both ends count
    paper, author = layout.slot["N0"], layout.slot["N1"]
    writes, rev_writes, cites = (layout.slot[t] for t in ("E0", "E1", "E2"))
    assert sorted(layout.slots.loads[paper]) == sorted([writes, rev_writes, cites])
    assert sorted(layout.slots.loads[author]) == sorted([writes, rev_writes])


def test_a_homogeneous_layout_is_as_it_was():
    """One node count, one edge_index: both rows index the node count, and the sizes, padding and targets are those
    of (nodes, edges) that the homogeneous padding has always used."""
    layout, why = buckets.layout_of(_captured(SAGEConv(FEATURES, 4), torch.randn(30, FEATURES), random_graph(30, 70)))
    assert why is None and layout.slots == buckets.HOMOGENEOUS and layout.order == ["N", "E"]
    assert [k for k in layout.kinds if k[0] in ("rows", "edge_index")] == [("rows", "N"), ("edge_index", "E")]
    edge_at = layout.edge_inputs[0]
    assert layout.ends == {edge_at: ("N", "N")}
    x, edge_index = torch.randn(300, 3), random_graph(300, 900)
    given = {"rows": x, "edge_index": edge_index, "size": None, "keep": None}
    args = [given[kind] if kind != "size" else (300 if tag == "N" else edge_index.shape[1])
            for kind, tag in layout.kinds]
    counts = layout.sizes(args)
    assert counts == (300, edge_index.shape[1])
    padded = buckets.padded_for(counts, layout.slots)
    assert padded == buckets.padded_sizes(*counts)
    targets = layout.targets(args, counts, padded)[edge_at]
    loops = counts[0] + torch.arange(padded[1]) % (padded[0] - counts[0])  # the padded nodes in turn, self loops
    assert torch.equal(targets, torch.stack([loops, loops])[:, counts[1]:])  # the padded edges' slots only


def _bipartite(sources: int, destinations: int) -> tuple:
    edge_index = torch.stack([torch.randint(0, sources, (70,)), torch.randint(0, destinations, (70,))])
    return (torch.randn(sources, FEATURES), torch.randn(destinations, FEATURES)), edge_index


@pytest.mark.parametrize("make", [
    lambda: SAGEConv((FEATURES, FEATURES), 4),
    lambda: GATConv((FEATURES, FEATURES), 4, heads=2, add_self_loops=False),
    lambda: TransformerConv((FEATURES, FEATURES), 4, heads=2),
], ids=["sage", "gat", "transformer"])
def test_a_bipartite_layer_maps_its_rows_to_sources_and_destinations(make):
    layout, why = buckets.layout_of(_captured(make(), *_bipartite(30, 20)))
    assert why is None and _rows_by_name(layout) == {"l_edge_index_": ("l_x_0_", "l_x_1_")}


def test_a_row_into_a_tensor_of_fixed_size_is_declined():
    """One source node: Dynamo fixes that count at 1, so the one changing node count is the destinations' and a
    padded edge's source would point past the sources' end."""
    reason = buckets.layout_of(_captured(SAGEConv((FEATURES, FEATURES), 4), *_bipartite(1, 20)))[1]
    assert reason.startswith("row 0 of l_edge_index_ indexes rows counted by 1, a fixed size"), reason


class _Ambiguous(torch.nn.Module):
    """Reads the writes relation's sources as authors and (folded into the papers' range) as papers."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(FEATURES, 4)

    def forward(self, x_dict, edge_index_dict):
        source, target = edge_index_dict[METADATA[1][0]]
        message = x_dict["author"][source] + x_dict["paper"][source % x_dict["paper"].shape[0]]
        return {"paper": self.lin(torch.zeros_like(x_dict["paper"]).index_add(0, target, message))}


class _SourcesUnread(torch.nn.Module):
    """Counts each paper's writes edges: the sources index nothing."""

    def forward(self, x_dict, edge_index_dict):
        target = edge_index_dict[METADATA[1][0]][1]
        degree = torch.zeros(x_dict["paper"].shape[0]).index_add(0, target, torch.ones(target.shape[0]))
        return {"paper": x_dict["paper"] * degree[:, None], "author": x_dict["author"] * 2}


@pytest.mark.parametrize("model,why", [
    (_Ambiguous, "row 0 of l_edge_index_dict_author_writes_paper_ indexes tensors of"),
    (_SourcesUnread, "row 0 of l_edge_index_dict_author_writes_paper_ indexes no tensor in the graph"),
])
def test_a_row_whose_node_type_is_not_determined_is_declined(model, why):
    reason = _why_not_padded(_dynamo_graph(model(), *TWO_TYPES))
    assert reason and reason.startswith(why), reason
    if model is _Ambiguous:
        assert "ambiguous" in reason


class _PaperCentred(torch.nn.Module):
    """Subtracts the mean over the papers: a padded paper would move every real paper's output."""

    def __init__(self):
        super().__init__()
        self.conv = HeteroConv({e: SAGEConv(FEATURES, 4) for e in METADATA[1]}, aggr="sum")

    def forward(self, x_dict, edge_index_dict):
        out = self.conv(x_dict, edge_index_dict)
        return {"paper": out["paper"] - out["paper"].mean(0), "author": out["author"]}


def test_a_mean_over_one_node_types_rows_is_declined_with_the_op():
    assert "mean.dim reduces over the rows" in (_why_not_padded(_dynamo_graph(_PaperCentred(), *TWO_TYPES)) or "")


# ---- the padding per node type and edge set ------------------------------------------------------------------------

def _hand_layout():
    """papers (N0) and authors (N1); writes (authors to papers), rev_writes (back) and cites (papers to papers, with
    an edge attribute); an output per node type and one per cites edge."""
    kinds = [("rows", "N0"), ("rows", "N1"), ("edge_index", "E0"), ("edge_index", "E1"), ("edge_index", "E2"),
             ("rows", "E2"), ("keep", None)]
    ends = {2: ("N1", "N0"), 3: ("N0", "N1"), 4: ("N0", "N0")}
    return buckets.Layout(kinds, {"N0": "p", "N1": "a"}, {"E0": "w", "E1": "r", "E2": "c"},
                          [[(0, "N0")], [(0, "N1")], [(0, "E2")], []], ends)


def test_padded_edges_join_padded_nodes_of_their_types_within_the_degree_bound():
    layout = _hand_layout()
    nodes, edges = _sizes(30, 20), {METADATA[1][0]: 70, METADATA[1][1]: 50, METADATA[1][2]: 40}
    x, edge_index = hetero_batch(nodes, edges, seed=3)
    args = [x["paper"], x["author"], *edge_index.values(), torch.randn(edge_index[METADATA[1][2]].shape[1], 2),
            torch.ones(3)]
    counts = layout.sizes(args)
    papers, authors = counts[:2]
    # padded nodes just enough: 64 padded edges end on papers (writes, rev_writes' sources, cites' self loops)
    padded = (papers + 2, authors + 2) + tuple(c + pad for c, pad in zip(counts[2:], (20, 20, 24)))
    assert buckets.fits(padded, counts, layout.slots)
    assert not buckets.fits((papers + 1,) + padded[1:], counts, layout.slots)
    px, pa, pw, pr, pc, pattr, keep = layout.pad(args, counts, padded)
    assert torch.equal(px[:papers], args[0]) and torch.equal(px[papers:], args[0][:1].expand(2, FEATURES))
    assert torch.equal(pa[authors:], args[1][:1].expand(2, FEATURES)) and keep is args[6]
    assert torch.equal(pattr[counts[4]:], args[5][:1].expand(24, 2))
    load = {"N0": torch.zeros(padded[0], dtype=torch.long), "N1": torch.zeros(padded[1], dtype=torch.long)}
    for i, padded_edges in zip((2, 3, 4), (pw, pr, pc)):
        real = counts[layout.slot[layout.kinds[i][1]]]
        assert padded_edges.shape[1] == padded[layout.slot[layout.kinds[i][1]]]
        assert torch.equal(padded_edges[:, :real], args[i])
        pads = padded_edges[:, real:]
        for row, tag in enumerate(layout.ends[i]):
            count = counts[layout.slot[tag]]
            assert bool((pads[row] >= count).all() and (pads[row] < padded[layout.slot[tag]]).all())
        for tag in dict.fromkeys(layout.ends[i]):
            load[tag] += torch.bincount(pads[layout.ends[i].index(tag)], minlength=len(load[tag]))
    assert torch.equal(pc[0, counts[4]:], pc[1, counts[4]:])  # within one type: self loops
    assert int(load["N0"].max()) == buckets.PAD_DEGREE and int(load["N1"].max()) <= buckets.PAD_DEGREE
    out = layout.trim((torch.zeros(padded[0], 4), torch.zeros(padded[1], 4), torch.zeros(padded[4]), 7), counts,
                       padded)
    assert [getattr(o, "shape", o) for o in out] == [(papers, 4), (authors, 4), (counts[4],), 7]


def test_a_larger_compiled_bucket_is_reused_only_where_every_size_fits():
    layout = _hand_layout()
    chooser = buckets.Bucketed.__new__(buckets.Bucketed)
    chooser.slots = layout.slots
    counts = (2000, 1000, 9000, 7000, 3000)
    own = buckets.padded_for(counts, layout.slots) + ((8,),)
    larger = tuple(buckets.bucket(size) for size in own[:5]) + ((8,),)  # one step up in every size
    assert all(size <= own[i] * buckets.REUSE for i, size in enumerate(larger[:5]))
    chooser.compiled = {larger: "f"}
    assert chooser.covering(own, *counts) == larger
    chooser.compiled = {larger[:2] + (own[2] - 64,) + larger[3:]: "f"}  # one edge set's size too small
    assert chooser.covering(own, *counts) is None
    chooser.compiled = {larger[:5] + ((16,),): "f"}  # another fixed shape
    assert chooser.covering(own, *counts) is None


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_hetero_buckets_settle_with_a_bucket_ahead_and_an_outlier_run_unpadded(monkeypatch, device):
    """Per node type and edge set: the settling call compiles the bucket one ladder step above in every size; later a
    batch that fits it runs there without a compile, and an outlier above every bucket runs the captured graph as it
    is; all checked against eager, forward and gradients (``_run``; on CUDA under ``mode="reduce-overhead"``, the
    unpadded call between CUDA-graph replays)."""
    monkeypatch.setattr(buckets, "SETTLE_CALLS", 2)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = HeteroConv({r: SAGEConv(FEATURES, 8) for r in METADATA[1]}, aggr="sum")
    writes, rev_writes, cites = METADATA[1]
    small = [(_sizes(45, 52), {writes: 100, rev_writes: 90, cites: 60}),
             (_sizes(57, 44), {writes: 120, rev_writes: 100, cites: 70}),
             (_sizes(50, 48), {writes: 110, rev_writes: 95, cites: 65})]
    outlier = (_sizes(600, 500), {writes: 1500, rev_writes: 1400, cites: 900})
    # papers and writes edges one step up the ladder (from 256 to 320), the other sizes in the smallest bucket
    fits_ahead = (_sizes(262, 100), {writes: 200, rev_writes: 100, cites: 50})
    entries, _ = _run(model.to(device), small + [outlier, fits_ahead], device=device)
    (entry,) = [e for e in entries if e.details["buckets"]]
    first, ahead = entry.details["buckets"]
    assert ahead == [buckets.bucket(size) for size in first]
    assert entry.details["unpadded_calls"] == 1
