"""The cost model: which rewrites it takes on CUDA by graph size, family and dtype, its thresholds and their
settings, the thresholds off under CUDA graphs, and what a declined graph becomes (Inductor's code, reported)."""
import torch
from torch_geometric.nn import GCNConv

from gnn_inductor.testing import check_rewrites, random_graph


def test_spmm_threshold_follows_its_environment_variable(monkeypatch):
    from gnn_inductor.cost import spmm_declined

    monkeypatch.delenv("GNN_IO_FORCE", raising=False)
    monkeypatch.setenv("GNN_IO_SPMM_MIN_EDGES", "1000")
    assert "cost model" in spmm_declined("cuda", 999)
    assert spmm_declined("cuda", 1000) is None
    assert spmm_declined("cpu", 10) is None  # the CPU path is the reference: always rewritten
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    assert spmm_declined("cuda", 10) is None


def test_declined_spmm_stays_with_inductor_and_is_reported(monkeypatch):
    """A match the cost model declines is neither SpMM nor gather-scatter, and is still correct."""
    import gnn_inductor.patterns.spmm as spmm_pattern

    monkeypatch.setattr(spmm_pattern, "spmm_declined", lambda device, edges: f"cost model: {edges} edges")
    torch.manual_seed(0)
    edge_index = random_graph(30, 100)
    result = check_rewrites(GCNConv(4, 4), torch.randn(30, 4), edge_index,
                            expect={"spmm": 0, "gather_scatter": 0, "near_miss": 1})
    assert result.near_misses[0].reason == f"cost model: {edge_index.shape[1]} edges"


def test_triton_binding_plan_carries_work_items(monkeypatch):
    """GNN_IO_SPMM=triton puts padded work items into the graph plan (no data-dependent sizes reach
    the compiled graph); on CPU the reference ignores them, the compile path is the same as on CUDA."""
    monkeypatch.setenv("GNN_IO_SPMM", "triton")
    torch.manual_seed(0)
    result = check_rewrites(GCNConv(6, 6), torch.randn(40, 6), random_graph(40, 150, hub_degree=300),
                            expect={"spmm": 1, "near_miss": 0})
    assert result.report["graphs"][0]["hoisted_structure_nodes"] > 0


def test_cost_model_thresholds(monkeypatch):
    """The CUDA cost model: below its edge thresholds SpMM and the fused gather-scatter are left to
    Inductor with a reason; other devices, unknown sizes and GNN_IO_FORCE=1 always rewrite."""
    from gnn_inductor import cost

    monkeypatch.delenv("GNN_IO_FORCE", raising=False)
    monkeypatch.delenv("GNN_IO_CUDAGRAPHS", raising=False)
    for declined, threshold in ((cost.spmm_declined, cost.SPMM_MIN_EDGES_CUDA),
                                (cost.gather_scatter_declined, cost.GATHER_SCATTER_MIN_EDGES_CUDA)):
        assert "cost model" in declined("cuda", threshold - 1)
        assert declined("cuda", threshold) is None
        assert declined("cpu", 10) is None and declined("cuda", None) is None
        monkeypatch.setenv("GNN_IO_FORCE", "1")
        assert declined("cuda", 10) is None
        monkeypatch.delenv("GNN_IO_FORCE")
    monkeypatch.setenv("GNN_IO_GS_MIN_EDGES", "5")
    assert cost.gather_scatter_declined("cuda", 10) is None


def test_cost_model_thresholds_are_off_under_cuda_graphs(monkeypatch):
    """GNN_IO_CUDAGRAPHS=1: a replay has no per-call CPU work, so no edge threshold declines SpMM, the fused
    gather-scatter or float32 attention (the mid-size GAT rule included); a threshold the user sets still holds;
    CPU devices and attention forms without a kernel are declined as before."""
    from gnn_inductor import cost

    for name in ("GNN_IO_FORCE", "GNN_IO_SPMM_MIN_EDGES", "GNN_IO_GS_MIN_EDGES", "GNN_IO_ATTENTION_MIN_EDGES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GNN_IO_CUDAGRAPHS", "1")
    assert cost.spmm_declined("cuda", 10) is None and cost.gather_scatter_declined("cuda", 10) is None
    for family in cost.ATTENTION_MIN_EDGES_CUDA:
        assert cost.attention_declined("cuda", 10, family, "float32", False, 5) is None
    assert "no fused kernel" in cost.attention_declined("cuda", 10, None, "float32", False)
    monkeypatch.setenv("GNN_IO_CPU_REWRITE", "0")
    assert "cost model" in cost.spmm_declined("cpu", 10)
    monkeypatch.setenv("GNN_IO_GS_MIN_EDGES", "100")
    assert "GNN_IO_GS_MIN_EDGES" in cost.gather_scatter_declined("cuda", 10)
    assert cost.spmm_declined("cuda", 10) is None
    monkeypatch.setenv("GNN_IO_ATTENTION_MIN_EDGES", "100")
    assert "cost model" in cost.attention_declined("cuda", 10, "dot", "float32", False)
    monkeypatch.setenv("GNN_IO_CUDAGRAPHS", "0")
    monkeypatch.delenv("GNN_IO_GS_MIN_EDGES")
    assert "cost model" in cost.gather_scatter_declined("cuda", 10)


def test_attention_cost_model(monkeypatch):
    """Float32 attention below its family's edge threshold is left to Inductor on CUDA, with TF32 allowed too for
    TransformerConv and GATConv only; half precision only for bfloat16 TransformerConv
    (test_bf16_transformer_threshold), other devices never, and
    GAT never from the sizes where Inductor's float32 GAT failed to launch."""
    from gnn_inductor import cost

    monkeypatch.delenv("GNN_IO_CUDAGRAPHS", raising=False)
    monkeypatch.delenv("GNN_IO_ATTENTION_PATH", raising=False)

    for family, threshold in cost.ATTENTION_MIN_EDGES_CUDA.items():
        assert "cost model" in cost.attention_declined("cuda", threshold - 1, family, "float32", False)
        assert cost.attention_declined("cuda", threshold, family, "float32", False) is None
        half = cost.attention_declined("cuda", 10, family, "bfloat16", False)
        assert ("cost model" in half) if family == "dot" else half is None, (family, half)
        assert cost.attention_declined("cuda", 10, family, "float16", False) is None
        tf32 = cost.attention_declined("cuda", threshold - 1, family, "float32", True)
        assert ("cost model" in tf32) if family in cost.TF32_DECLINED_FAMILIES else tf32 is None, (family, tf32)
        assert cost.attention_declined("cuda", threshold, family, "float32", True) is None
        assert cost.attention_declined("cpu", 10, family, "float32", False) is None
    assert set(cost.ATTENTION_MIN_EDGES_CUDA) == {"dot", "gat", "gatv2"}
    assert cost.TF32_DECLINED_FAMILIES == ("dot", "gat")
    # a forced kernel path runs at any size; a form without a kernel is still left to Inductor
    for path in ("csr", "block", "hybrid"):
        monkeypatch.setenv("GNN_IO_ATTENTION_PATH", path)
        assert cost.attention_declined("cuda", 10, "dot", "float32", True) is None
        assert "no fused kernel" in cost.attention_declined("cuda", 10, None, "float32", False)
    monkeypatch.setenv("GNN_IO_ATTENTION_PATH", "auto")
    assert "cost model" in cost.attention_declined("cuda", 10, "dot", "float32", True)
    assert cost.ATTENTION_MIN_EDGES_CUDA["gat"] < 4_200_000  # Inductor's float32 GAT failed to launch at 4.2M edges
    assert cost.attention_declined("cuda", 4_200_000, "gat", "float32", False) is None


def test_bf16_transformer_threshold(monkeypatch):
    """bfloat16 TransformerConv under 500k edges goes to Inductor (measured: Inductor ahead on SNAP facebook,
    road-luxembourg-osm, ca-AstroPh and squirrel, behind from MUSAE-github's 578k edges on); bf16 GAT and GATv2
    never (Inductor's bf16 GAT crashes, its GATv2 crashed or trailed); GNN_IO_ATTENTION_MIN_EDGES moves it;
    CUDA graphs, GNN_IO_FORCE and a forced path lift it."""
    from gnn_inductor import cost

    for name in ("GNN_IO_CUDAGRAPHS", "GNN_IO_ATTENTION_PATH", "GNN_IO_ATTENTION_MIN_EDGES", "GNN_IO_FORCE"):
        monkeypatch.delenv(name, raising=False)
    threshold = cost.HALF_ATTENTION_MIN_EDGES_CUDA[("dot", "bfloat16")]
    assert 396_846 < threshold <= 578_006  # squirrel declined, MUSAE-github kept
    assert "bfloat16 dot attention" in cost.attention_declined("cuda", threshold - 1, "dot", "bfloat16", False)
    assert cost.attention_declined("cuda", threshold, "dot", "bfloat16", False) is None
    for family in ("gat", "gatv2"):
        assert cost.attention_declined("cuda", 10, family, "bfloat16", False) is None
    assert cost.attention_declined("cpu", 10, "dot", "bfloat16", False) is None
    monkeypatch.setenv("GNN_IO_ATTENTION_MIN_EDGES", "100")
    assert cost.attention_declined("cuda", 1000, "dot", "bfloat16", False) is None
    assert "GNN_IO_ATTENTION_MIN_EDGES" in cost.attention_declined("cuda", 99, "dot", "bfloat16", False)
    monkeypatch.delenv("GNN_IO_ATTENTION_MIN_EDGES")
    monkeypatch.setenv("GNN_IO_CUDAGRAPHS", "1")
    assert cost.attention_declined("cuda", 10, "dot", "bfloat16", False) is None
    monkeypatch.delenv("GNN_IO_CUDAGRAPHS")
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    assert cost.attention_declined("cuda", 10, "dot", "bfloat16", False) is None
    monkeypatch.delenv("GNN_IO_FORCE")
    monkeypatch.setenv("GNN_IO_ATTENTION_PATH", "csr")
    assert cost.attention_declined("cuda", 10, "dot", "bfloat16", False) is None


def test_gat_mid_size_rule_takes_graphs_of_enough_edges_and_rows(monkeypatch):
    """Float32 GATConv under its edge threshold takes the fused path from 1M edges when the graph also has 100k
    destination rows (RMAT 2^17 and 2^18 won, soc-Slashdot0902 with 82k rows did not); other
    families have no such rule, and GNN_IO_ATTENTION_MIN_EDGES sets one plain threshold instead."""
    from gnn_inductor import cost

    monkeypatch.delenv("GNN_IO_CUDAGRAPHS", raising=False)
    edges, rows = cost.ATTENTION_MIN_EDGES_AND_ROWS_CUDA["gat"]
    assert edges < cost.ATTENTION_MIN_EDGES_CUDA["gat"]
    assert cost.attention_declined("cuda", edges, "gat", "float32", False, rows) is None
    assert cost.attention_declined("cuda", 1_092_745, "gat", "float32", False, 131_072) is None     # RMAT 2^17
    assert "cost model" in cost.attention_declined("cuda", 1_086_763, "gat", "float32", False, 82_168)  # Slashdot
    # TF32: the same rule; under it GATConv goes to Inductor, GATv2Conv does not
    assert cost.attention_declined("cuda", 1_092_745, "gat", "float32", True, 131_072) is None      # RMAT 2^17
    assert "cost model" in cost.attention_declined("cuda", 396_160, "gat", "float32", True, 18_772)  # ca-AstroPh
    assert cost.attention_declined("cuda", 396_160, "gatv2", "float32", True, 18_772) is None
    assert "cost model" in cost.attention_declined("cuda", edges - 1, "gat", "float32", False, 10 * rows)
    assert "cost model" in cost.attention_declined("cuda", edges, "gat", "float32", False, None)
    assert "cost model" in cost.attention_declined("cuda", 900_000, "dot", "float32", False, 10 * rows)
    monkeypatch.setenv("GNN_IO_ATTENTION_MIN_EDGES", str(2 * edges))
    assert "cost model" in cost.attention_declined("cuda", edges, "gat", "float32", False, rows)


def test_attention_form_without_a_kernel_goes_to_inductor_on_cuda(monkeypatch):
    """A form no kernel covers (family None, e.g. PyG's SoftmaxAggregation) would run the op's reference on
    CUDA: declined there at any size and precision, kept on CPU (where the reference is the path) and when
    forced."""
    from gnn_inductor import cost

    for dtype, tf32 in (("float32", False), ("bfloat16", False), ("float32", True)):
        assert "no fused kernel" in cost.attention_declined("cuda", 50_000_000, None, dtype, tf32)
    assert cost.attention_declined("cpu", 50_000_000, None, "float32", False) is None
    monkeypatch.setenv("GNN_IO_FORCE", "1")
    assert cost.attention_declined("cuda", 50_000_000, None, "float32", False) is None


def test_attention_rewrite_gives_the_cost_model_its_rows(monkeypatch):
    """The backend asks the cost model with the attention's destination rows (the mid-size rule reads them)."""
    from gnn_inductor import cost
    from torch_geometric.nn import GATConv

    asked = []
    monkeypatch.setattr(cost, "attention_declined", lambda device, edges, family, dtype, tf32, rows=None:
                        asked.append((family, edges, rows)))
    edge_index = random_graph(40, 160, hub_degree=60)
    check_rewrites(GATConv(6, 3, heads=2), torch.randn(40, 6), edge_index, expect={"attention": 1})
    assert asked and all(a == ("gat", edge_index.shape[1], 40) for a in asked), asked


def test_declined_attention_graph_goes_to_inductor_whole(monkeypatch):
    """A graph whose only rewrites are declined attention runs as torch.compile's default would (no gnn_io
    op, no plan), is still correct, and the report says why for each layer."""
    from gnn_inductor import cost
    from torch_geometric.nn import GATConv

    monkeypatch.setattr(cost, "attention_declined", lambda device, edges, family, dtype, tf32, rows=None:
                        f"cost model: {family} {dtype} at {edges} edges")
    torch.manual_seed(0)
    edge_index = random_graph(40, 160, hub_degree=60)
    result = check_rewrites(GATConv(6, 3, heads=2), torch.randn(40, 6), edge_index,
                            expect={"attention": 0, "edge_softmax": 0, "near_miss": 1})
    assert result.near_misses[0].reason == f"cost model: gat float32 at {edge_index.shape[1]} edges"
    assert result.report["graphs"][0]["hoisted_structure_nodes"] == 0
