"""A failure inside the backend or inside Inductor never becomes the user's crash: the graph runs another safe way
(op by op, the rewritten graph, Dynamo's graph in eager mode, Inductor without the backend's passes), matches eager,
and the report names what failed; ``GNN_IO_STRICT=1`` raises instead."""
import pytest
import torch
from torch_geometric.nn import GCNConv

from gnn_inductor.testing import check_rewrites, random_graph
from tests.test_backend import check_against_eager


@pytest.mark.parametrize("crashing", ["forward", "backward"])
def test_inductor_compile_crash_leaves_the_graph_op_by_op(monkeypatch, crashing):
    """A crash inside Inductor's per-graph compile (of the forward graph, or of the backward graph,
    which Inductor compiles lazily at the first backward) must not reach the user: the graph runs op
    by op, outputs and gradients still match eager, and the report says why."""
    import torch._inductor.compile_fx as inductor
    from torch_geometric.nn import SAGEConv

    from gnn_inductor.testing import check_rewrites, random_graph

    real = inductor.compile_fx_inner

    def crash(gm, example_inputs, **kwargs):
        if kwargs.get("is_backward", False) == (crashing == "backward"):
            raise RuntimeError("A compilation subprocess exited unexpectedly (simulated)")
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(inductor, "compile_fx_inner", crash)
    monkeypatch.delenv("GNN_IO_STRICT", raising=False)
    torch.manual_seed(0)
    result = check_rewrites(SAGEConv(8, 4, aggr="max"), torch.randn(30, 8), random_graph(30, 120),
                            expect={"gather_scatter": 1})
    reasons = [m.reason for m in result.near_misses]
    assert any("Inductor failed to compile this graph" in r for r in reasons), reasons


def _compile_with_crashing_inductor(monkeypatch, crashing: str):
    """Inductor failing on any graph without gnn_io ops (in the forward or the backward compile), and the cost
    model declining every attention graph (on CUDA: small float32 graphs), as a stand-in."""
    import torch._inductor.compile_fx as inductor

    from gnn_inductor import cost
    from gnn_inductor.rewrite_report import clear

    real = inductor.compile_fx_inner

    def crash(gm, example_inputs, **kwargs):
        ours = any(n.op == "call_function" and "gnn_io" in str(n.target) for n in gm.graph.nodes)
        if not ours and kwargs.get("is_backward", False) == (crashing == "backward"):
            raise RuntimeError("Inductor failed on Dynamo's graph (simulated)")
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(inductor, "compile_fx_inner", crash)
    monkeypatch.setattr(cost, "attention_declined", lambda *a, **k: "declined for the test")
    monkeypatch.delenv("GNN_IO_STRICT", raising=False)
    torch._dynamo.reset()
    clear()


@pytest.mark.parametrize("crashing", ["forward", "backward"])
def test_a_declined_graph_inductor_cannot_compile_runs_the_fused_attention(monkeypatch, crashing):
    """A graph of fixed sizes the cost model leaves to Inductor whole, where Inductor fails (forward or backward,
    both compiled up front): the rewritten graph runs (its plan built once), not Dynamo's graph op by op. Results
    match eager; the report says why."""
    from torch_geometric.nn import GATConv

    from gnn_inductor.rewrite_report import reports

    _compile_with_crashing_inductor(monkeypatch, crashing)
    torch.manual_seed(0)
    conv = GATConv(6, 3, heads=2)
    check_against_eager(conv, torch.randn(40, 6), random_graph(40, 150, hub_degree=20))
    mine = reports(conv)
    assert [r.pattern for g in mine for r in g.rewrites if r.pattern == "attention"], mine
    reasons = [m.reason for g in mine for m in g.near_misses]
    assert any("Inductor failed on Dynamo's graph (simulated)" in r and "fused attention runs instead" in r
               for r in reasons), reasons
    assert not any("runs op by op" in r for r in reasons), reasons
    torch._dynamo.reset()


def test_a_declined_graph_of_changing_sizes_inductor_cannot_compile_runs_eagerly(monkeypatch):
    """Mini-batches (sizes that change, Dynamo's dynamic-shape graph) where Inductor fails on a declined graph
    (GATConv on the H100: an unbacked-size assertion): Dynamo's graph runs in eager mode, with no gnn_io op and no
    plan; results match eager at every size; the report says why."""
    from torch_geometric.nn import GATConv

    from gnn_inductor.rewrite_report import reports
    from tests.plan.test_plan import op_counts

    _compile_with_crashing_inductor(monkeypatch, "backward")
    torch.manual_seed(0)
    conv = GATConv(6, 3, heads=2)
    for step, nodes in enumerate((40, 47, 53)):
        edge_index = random_graph(nodes, 4 * nodes, seed=step, hub_degree=nodes // 2)
        counts = op_counts(lambda: check_against_eager(conv, torch.randn(nodes, 6), edge_index))
        if step == 2:  # the dynamic-shape graph, compiled at step 1: nothing of gnn_io's runs
            assert not any(name.startswith("gnn_io::") for name in counts), counts
    reasons = [m.reason for g in reports(conv) for m in g.near_misses]
    assert any("Inductor failed on Dynamo's graph (simulated)" in r and "in eager mode" in r for r in reasons), reasons
    torch._dynamo.reset()


def test_graphs_left_to_inductor_whole_keep_its_own_tiles(monkeypatch):
    """A graph the cost model declines compiles exactly as torch.compile's default: Inductor's own
    ``triton.max_tiles``, not the backend's 2 (unless GNN_IO_INDUCTOR_MAX_TILES is set)."""
    import torch._inductor.compile_fx as inductor
    from torch._inductor import config as inductor_config
    from torch_geometric.nn import GATConv

    from gnn_inductor import cost

    default = inductor_config.triton.max_tiles
    real, seen = inductor.compile_fx_inner, []

    def record(gm, example_inputs, **kwargs):
        seen.append(inductor_config.triton.max_tiles)
        return real(gm, example_inputs, **kwargs)

    monkeypatch.setattr(inductor, "compile_fx_inner", record)
    monkeypatch.setattr(cost, "attention_declined", lambda *a, **k: "declined for the test")
    monkeypatch.delenv("GNN_IO_INDUCTOR_MAX_TILES", raising=False)
    torch.manual_seed(0)
    check_rewrites(GATConv(8, 4, heads=2), torch.randn(30, 8), random_graph(30, 120),
                   expect={"attention": 0, "near_miss": 1})
    assert seen and all(tiles == default for tiles in seen), (seen, default)


def test_a_rewrite_error_without_a_message_still_falls_back(monkeypatch):
    """An exception raised without a message (``AssertionError()``) inside the rewrite must reach the report as a
    near miss with the graph left to Inductor, not crash the fallback (its first line is an empty list's)."""
    import gnn_inductor.backend as backend

    def fail(state):
        raise AssertionError()

    monkeypatch.setattr(backend, "_rewrite_and_compile", fail)
    monkeypatch.delenv("GNN_IO_STRICT", raising=False)
    torch.manual_seed(0)
    result = check_rewrites(GCNConv(4, 3), torch.randn(12, 4), random_graph(12, 30), expect={"spmm": 0})
    assert [m.reason for m in result.near_misses] == [
        "graph left to Inductor unchanged: the pass canonicalize raised AssertionError: "]


@pytest.mark.parametrize("error", [IndexError, RuntimeError, KeyError])
@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_an_exception_in_a_backend_pass_goes_to_inductor_naming_the_pass(monkeypatch, error, strict):
    """Any exception a pass of the backend raises while compiling (an ``IndexError`` included: the user's index
    errors come from the plan at run time, never from a pass) leaves the graph to Inductor, correct against eager,
    with a report entry naming the pass and the error; ``GNN_IO_STRICT=1`` raises it."""
    from gnn_inductor.passes import structure

    def fail(gm):
        raise error("list index out of range")

    monkeypatch.setattr(structure, "hoist_structure", fail)
    if strict:
        monkeypatch.setenv("GNN_IO_STRICT", "1")
    else:
        monkeypatch.delenv("GNN_IO_STRICT", raising=False)
    torch.manual_seed(0)
    conv, x, edge_index = GCNConv(4, 3), torch.randn(12, 4), random_graph(12, 30)
    if strict:
        torch._dynamo.reset()
        with pytest.raises(Exception, match="list index out of range"):
            torch.compile(conv, backend="gnn_io")(x, edge_index)
        return
    result = check_rewrites(conv, x, edge_index, expect={"spmm": 0})
    assert [m.reason.split(":")[1] for m in result.near_misses] == [" the pass hoist_structure raised " + error.__name__]


def test_an_exception_in_a_pass_after_the_split_compiles_the_graph_without_those_passes(monkeypatch):
    """The passes on the forward and backward graphs after AOTAutograd's split run inside Inductor's compile (the
    backward's at the first backward): one that raises leaves that graph compiled without them, correct, with a
    report entry naming the pass."""
    from gnn_inductor.passes import direct_ops

    def fail(gm):
        raise RuntimeError("retarget failed")

    monkeypatch.setattr(direct_ops, "retarget", fail)
    monkeypatch.delenv("GNN_IO_STRICT", raising=False)
    torch.manual_seed(0)
    result = check_rewrites(GCNConv(4, 3), torch.randn(12, 4), random_graph(12, 30), expect={"spmm": 1})
    reasons = [m.reason for m in result.near_misses]
    assert reasons and all(r.startswith("the pass direct_ops raised RuntimeError: retarget failed") for r in reasons)
