"""The attention path choice (kernels/attention/selector.py) on CPU, without running a kernel: the cost model and its
calibration by device, the forms and precisions kept on CSR, forced paths and orders, hub windows left to CSR, an
order's build time and predicted gain, the first call's timings (on a fake clock) of a block or hybrid pick against
CSR and of an order against the identity order, a first call inside a CUDA graph capture, and the report's list of
decisions."""
import gnn_inductor.kernels  # noqa: F401  (registers the ops)
import pytest
import torch
from gnn_inductor.kernels.attention import layout as attention_layout, selector as attention_paths
from gnn_inductor.plan import block_format
from gnn_inductor.plan import decisions as plan_decisions
from gnn_inductor.plan import state as graph_state

from tests.kernels.attention.cases import edge_fn
from tests.kernels.attention.paths_cases import (
    community_graph,
    fresh_cache,  # noqa: F401  (fixture)
    without_fixed_costs,
)
from tests.kernels.attention.test_block_sparse import CHANNELS, HEADS, dot_inputs, graph

aten = torch.ops.aten


def setup(src, dst, num_nodes, dtype=torch.float32):
    plan = torch.ops.gnn_io.csr_plan(dst, src, num_nodes, num_nodes)
    args, roles, score, message, _ = dot_inputs(num_nodes, False, dtype)
    layout = attention_layout.prepare(args, roles, plan[3], score, message)
    items = list(torch.ops.gnn_io.work_items(plan[0], plan[1], 256))
    return plan, args, roles, score, message, layout, items


# ---- the cost model and its decisions ----

def test_window_costs_follow_the_calibration():
    src, dst = graph(40, 120, seed=1, hub_degree=30)
    plan, *_ = setup(src, dst, 40)
    blocks = block_format.build_block_format(plan[0], plan[1], plan[3], 40)
    csr, block, edges, tiles = attention_paths.window_costs(blocks, plan[0], "half", 1.0)
    k = attention_paths.calibration("dot", "half", plan[0].device)
    rows = (blocks.window_rows >= 0).sum(1)
    assert int(edges.sum()) == src.numel() and int(tiles.sum()) == blocks.stats["tiles"]
    torch.testing.assert_close(csr, (k["csr_per_edge"] * edges + k["csr_per_row"] * rows) * 1e-6)
    torch.testing.assert_close(block, (k["block_per_tile"] * tiles + k["block_per_row"] * rows) * 1e-6)


def test_csr_cost_grows_with_the_identity_orders_tiles_per_edge():
    """The CSR cost's locality term (TF32 / IEEE dot calibration): per edge, ``csr_per_identity_tile`` times the
    graph's tiles per edge in its own order, which :func:`identity_tiles_per_edge` takes from the identity order's
    block format once per plan entry."""
    src, dst = graph(64, 400, seed=2)
    plan, *_ = setup(src, dst, 64)
    entry = graph_state.state_of(plan[0], plan[1], plan[3])
    locality = attention_paths.identity_tiles_per_edge(entry)
    blocks = attention_paths._format(entry, "none")
    assert locality == pytest.approx(blocks.stats["tiles"] / src.numel()) and locality > 0
    entry.slot("formats").clear()
    assert attention_paths.identity_tiles_per_edge(entry) == locality and not entry.slot("formats")  # kept, not rebuilt
    k = attention_paths.calibration("dot", "tf32", plan[0].device)
    assert k["csr_per_identity_tile"] > 0
    csr0, block0, edges, _ = attention_paths.window_costs(blocks, plan[0], "tf32", 1.0)
    csr1, block1, _, _ = attention_paths.window_costs(blocks, plan[0], "tf32", 1.0, identity_tiles_per_edge=locality)
    torch.testing.assert_close(csr1 - csr0, k["csr_per_identity_tile"] * locality * edges * 1e-6)
    torch.testing.assert_close(block1, block0)


def test_calibration_by_device_name(monkeypatch):
    """A GPU with its own refit (``DEVICE_CALIBRATION``, matched on the device's name) is priced by it, another by
    the H100 table, a CPU tensor by the H100 table; ``GNN_IO_CALIBRATION`` overrides, and refuses a table the
    repo does not keep; a (family, precision) the refit lacks keeps the H100 constants."""
    monkeypatch.delenv(attention_paths.CALIBRATION_ENV, raising=False)
    monkeypatch.setattr(attention_paths, "_cuda_name", lambda index: "NVIDIA H200")
    h200 = attention_paths.DEVICE_CALIBRATION["H200"]["dot"]["tf32"]
    cuda = torch.device("cuda", 0)
    assert attention_paths.calibration_name(cuda) == "H200"
    assert attention_paths.calibration("dot", "tf32", cuda) is h200
    assert attention_paths.calibration("dot", "half", cuda) is attention_paths.CALIBRATION["dot"]["half"]
    assert attention_paths.calibration("gatv2", "tf32", cuda) is attention_paths.CALIBRATION["gat"]["tf32"]
    assert attention_paths.calibration("dot", "tf32", "cpu") is attention_paths.CALIBRATION["dot"]["tf32"]
    for other in ("NVIDIA H100 80GB HBM3", "NVIDIA GH200 480GB"):
        monkeypatch.setattr(attention_paths, "_cuda_name", lambda index, other=other: other)
        assert attention_paths.calibration("dot", "tf32", cuda) is attention_paths.CALIBRATION["dot"]["tf32"]
    monkeypatch.setenv(attention_paths.CALIBRATION_ENV, "h200")
    assert attention_paths.calibration("dot", "tf32", "cpu") is h200
    monkeypatch.setenv(attention_paths.CALIBRATION_ENV, "A100")
    with pytest.raises(attention_paths.SettingError, match="GNN_IO_CALIBRATION"):
        attention_paths.calibration("dot", "tf32", cuda)


def test_precision_classes():
    assert plan_decisions.precision_of(torch.bfloat16) == "half"
    assert plan_decisions.precision_of(torch.float16) == "half"
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert plan_decisions.precision_of(torch.float32) == "ieee"
        torch.set_float32_matmul_precision("high")
        assert plan_decisions.precision_of(torch.float32) == "tf32"
    finally:
        torch.set_float32_matmul_precision(previous)


def test_fp32_without_tf32_stays_on_csr(monkeypatch):
    monkeypatch.setattr(attention_paths, "precision_of", lambda dtype: "ieee")
    src, dst = community_graph()
    plan, args, roles, score, message, layout, items = setup(src, dst, 256)
    decision = attention_paths.decide(layout, plan[0], plan[1], plan[3], items, torch.float32)
    assert decision.path == "csr" and "TF32" in decision.reason


def test_gatv2_runs_on_block_only_when_forced(monkeypatch):
    from tests.kernels.attention.test_block_sparse_gat import CASES, NUM_NODES, make_args

    score_fn, message_fn, family, kinds = CASES["gatv2"]
    src, dst = graph(NUM_NODES, 200, seed=7)
    plan = torch.ops.gnn_io.csr_plan(dst, src, NUM_NODES, NUM_NODES)
    args = make_args(kinds, src.numel(), torch.bfloat16)
    layout = attention_layout.prepare(args, [r for r, _ in kinds], plan[3], edge_fn(score_fn), edge_fn(message_fn))
    decision = attention_paths.decide(layout, plan[0], plan[1], plan[3], [], torch.bfloat16)
    assert decision.path == "csr" and "slower" in decision.reason
    monkeypatch.setenv(attention_paths.PATH_ENV, "block")
    assert attention_paths.decide(layout, plan[0], plan[1], plan[3], [], torch.bfloat16).path != "csr"


def test_unsupported_forms_stay_on_csr(monkeypatch):
    # a GAT whose value is an edge-role input: the block kernels refuse it, the CSR kernel runs
    def gat_score(a0, a1, a2):
        return aten.leaky_relu.default(aten.add.Tensor(a1, a2), 0.2)

    def gat_message(alpha, a0, a1, a2):
        return aten.mul.Tensor(aten.unsqueeze.default(alpha, -1), a0)

    monkeypatch.setenv(attention_paths.PATH_ENV, "block")
    src, dst = graph(20, 30)
    plan = torch.ops.gnn_io.csr_plan(dst, src, 20, 20)
    args = [torch.randn(src.numel(), HEADS, CHANNELS), torch.randn(20, HEADS), torch.randn(20, HEADS)]
    roles = [2, 0, 1]  # edge, src, dst
    layout = attention_layout.prepare(args, roles, plan[3], edge_fn(gat_score), edge_fn(gat_message))
    assert layout.form.family == "gat"
    decision = attention_paths.decide(layout, plan[0], plan[1], plan[3], [], torch.bfloat16)
    assert decision.path == "csr" and "value" in decision.reason, decision.reason


def test_dense_communities_go_to_tensor_cores_after_reordering(monkeypatch):
    # hidden communities: the identity order fills tiles poorly; an order that brings communities together
    # cuts the tiles, and with many expected calls the policy applies it (the cost model then picks block)
    monkeypatch.setenv(attention_paths.CALLS_ENV, "100000000")
    without_fixed_costs(monkeypatch)
    src, dst = community_graph()
    plan, args, roles, score, message, layout, items = setup(src, dst, 256)
    decision = attention_paths.decide(layout, plan[0], plan[1], plan[3], items, torch.bfloat16)
    assert decision.path in ("block", "hybrid"), decision.as_dict()
    assert decision.order != "none", decision.as_dict()
    tiles = {name: value for name, value in decision.predicted_ms.items() if name.startswith("hybrid[")}
    assert tiles[f"hybrid[{decision.order}]"] < tiles["hybrid[none]"]
    assert decision.stats["block_windows"] > 0 and decision.stats["format_bytes"] > 0
    # cached per plan: the same object again, and listed once in the report's decisions
    again = attention_paths.decide(layout, plan[0], plan[1], plan[3], items, torch.bfloat16)
    assert again is decision and len(graph_state.decisions()) == 1
    assert graph_state.decisions()[0]["order"] == decision.order


def test_a_csr_decision_keeps_no_block_format(monkeypatch):
    # the block formats built to predict a path are memory the CSR kernel never reads: dropped with the decision
    monkeypatch.setenv("GNN_IO_REORDER", "off")
    for precision in ("ieee", "half"):  # block far too costly: the cost model picks CSR on every window
        monkeypatch.setitem(attention_paths.CALIBRATION["dot"], precision, {
            "csr_per_edge": 1.0, "csr_per_row": 0.0, "csr_fixed_ms": 0.0,
            "block_per_tile": 1e6, "block_per_row": 1.0, "block_fixed_ms": 0.0})
    src, dst = community_graph()
    plan, args, roles, score, message, layout, items = setup(src, dst, 256)
    decision = attention_paths.decide(layout, plan[0], plan[1], plan[3], items, torch.bfloat16)
    assert decision.path == "csr" and decision.reason.startswith("cost model"), decision.as_dict()
    assert decision.stats["tiles"] > 0  # a format was built for the prediction ...
    assert not graph_state.state_of(plan[0], plan[1], plan[3]).slot("formats")  # ... and not kept


def test_one_call_never_pays_for_an_order(monkeypatch):
    monkeypatch.setenv(attention_paths.CALLS_ENV, "1")
    src, dst = community_graph()
    plan, args, roles, score, message, layout, items = setup(src, dst, 256)
    decision = attention_paths.decide(layout, plan[0], plan[1], plan[3], items, torch.bfloat16)
    assert decision.order == "none"


def test_an_orders_build_time_leaves_out_library_imports(monkeypatch):
    """The order's build time, which the policy weighs against its gain, starts after the candidate's libraries
    are imported (a one-time process cost: a cold scipy import took one plan's RCM build from about 360 ms to
    1272 ms on the H200, and the policy then took the degree order), as reorder's own builds do."""
    from gnn_inductor.plan import orders as reorder

    events = []
    monkeypatch.setattr(reorder, "load_libraries", lambda name: events.append(("load", name)))

    def slow_rcm(rowptr, col):
        events.append(("build", "rcm"))
        return torch.arange(rowptr.numel() - 1)
    monkeypatch.setitem(reorder.CANDIDATES, "rcm", slow_rcm)
    src, dst = community_graph()
    plan = setup(src, dst, 256)[0]
    graph_state.clear()
    entry = graph_state.state_of(plan[0], plan[1], plan[3])
    clock = iter([10.0, 10.5])  # the timer's two reads: 500 ms of build
    monkeypatch.setattr(attention_paths.time, "perf_counter", lambda: next(clock))
    order, build_ms = attention_paths._order(entry, "rcm")
    monkeypatch.undo()  # the real clock back before anything else reads it
    assert events == [("load", "rcm"), ("build", "rcm")]
    assert build_ms == pytest.approx(500.0) and torch.equal(order, torch.arange(plan[0].numel() - 1))
    assert attention_paths._order(entry, "rcm")[1] == build_ms and len(events) == 2  # cached with the plan
    graph_state.clear()


def test_reorder_builds_load_libraries_first(monkeypatch):
    from gnn_inductor.plan import orders as reorder

    loaded = []
    monkeypatch.setattr(reorder, "load_libraries", loaded.append)
    rowptr, col = torch.tensor([0, 1, 2]), torch.tensor([1, 0])
    reorder._build("degree", rowptr, col)
    assert loaded == ["degree"]


def test_forced_paths_and_orders(monkeypatch):
    src, dst = graph(40, 120, seed=1, hub_degree=30, duplicates=2)
    plan, args, roles, score, message, layout, items = setup(src, dst, 40)
    monkeypatch.setenv(attention_paths.PATH_ENV, "csr")
    assert attention_paths.decide(layout, plan[0], plan[1], plan[3], items, torch.bfloat16).path == "csr"
    monkeypatch.setenv(attention_paths.PATH_ENV, "block")
    monkeypatch.setenv("GNN_IO_REORDER", "degree")
    decision = attention_paths.decide(layout, plan[0], plan[1], plan[3], items, torch.float32)
    # windows with a duplicate pair go to CSR even when block is forced: the path is a hybrid then
    assert decision.path == "hybrid" and decision.order == "degree"
    assert not bool(decision.blocks.dense_ok.all()) and decision.csr_items[0].numel() > 0
    monkeypatch.setenv(attention_paths.PATH_ENV, "sometimes")
    with pytest.raises(ValueError, match="GNN_IO_ATTENTION_PATH"):
        attention_paths.decide(layout, plan[0], plan[1], plan[3], items, torch.float32)


def test_hub_windows_stay_on_csr(monkeypatch):
    monkeypatch.setattr(attention_paths, "MAX_WINDOW_TILES", 1)
    monkeypatch.setenv(attention_paths.PATH_ENV, "block")
    monkeypatch.setenv("GNN_IO_REORDER", "off")
    src, dst = graph(40, 60, seed=1, hub_degree=30)
    plan, args, roles, score, message, layout, items = setup(src, dst, 40)
    decision = attention_paths.decide(layout, plan[0], plan[1], plan[3], items, torch.float32)
    blocks = block_format.build_block_format(plan[0], plan[1], plan[3], 40)
    tiles = blocks.tile_ptr[1:] - blocks.tile_ptr[:-1]
    assert torch.equal(decision.blocks.dense_ok, blocks.dense_ok & (tiles == 1))
    # the CSR items hold exactly the rows of the other windows
    on_csr = set(decision.csr_items[0].tolist())
    for w in range(blocks.window_rows.shape[0]):
        rows = [r for r in blocks.window_rows[w].tolist() if r >= 0 and plan[0][r + 1] > plan[0][r]]
        assert all((r in on_csr) != bool(decision.blocks.dense_ok[w]) for r in rows), w


def test_report_lists_decisions(monkeypatch):
    from gnn_inductor import rewrite_report

    monkeypatch.setenv(attention_paths.PATH_ENV, "block")
    monkeypatch.setenv("GNN_IO_REORDER", "off")
    src, dst = community_graph()
    plan, args, roles, score, message, layout, items = setup(src, dst, 256)
    decision = attention_paths.decide(layout, plan[0], plan[1], plan[3], items, torch.bfloat16)
    text = rewrite_report.format_text()
    assert f"attention path (dot, half): {decision.path}, order none" in text
    assert f"{decision.stats['block_windows']} of {decision.stats['windows']} row windows on Tensor Cores" in text
    assert rewrite_report.as_json()["attention_paths"][-1]["path"] == decision.path


# ---- the first call's timings (recorded, or on a fake clock: no kernel runs) ----

@pytest.mark.parametrize("identity_windows", [False, True])
def test_order_gain_is_timed_against_what_the_identity_order_would_run(identity_windows, monkeypatch):
    """The order's measured gain compares it with the identity order's own pick: the CSR path where the cost model
    picks no window in that order (not a hybrid of zero windows, whose CSR rows take the atomic backward), else the
    hybrid of the windows it picks (``_decide`` drops a source CSR built for the timings where the pick is not
    CSR: test_block_pick_is_checked_by_one_timing_against_csr). Structure only: the steps are recorded, not run."""
    src, dst = community_graph()
    rowptr, col, row, perm = torch.ops.gnn_io.csr_plan(dst, src, 256, 256)[:4]
    entry = graph_state.state_of(rowptr, col, perm)
    blocks = attention_paths._format(entry, "none")
    chosen = torch.zeros_like(blocks.dense_ok)
    if identity_windows:
        chosen[0] = True
    monkeypatch.setattr(attention_paths, "_choose_windows", lambda *a: (chosen, {}))
    monkeypatch.setattr(attention_paths, "_paired_ms", lambda device, runs: {k: (run(), 1.0)[1] for k, run in
                                                                             runs.items()})
    ran = []

    def forward_fn(candidate, backward=False):
        ran.append((candidate.path, backward))
    decision = plan_decisions.PathDecision("block", "test", "dot", "half", order="rcm")
    items = list(torch.ops.gnn_io.work_items(rowptr, col, 256))
    timed = attention_paths._measure_order_gain(entry, decision, forward_fn, None, items, "half", 1.0, "block")
    assert ran == [("hybrid" if identity_windows else "csr", True), ("block", True)]
    assert set(timed) == {"none fwd+bwd" if identity_windows else "none fwd+bwd (csr)", "rcm fwd+bwd"}


@pytest.mark.parametrize("csr_ms, block_ms, kept", [(4.0, 1.0, True), (1.0, 4.0, False), (1.0, 0.98, False)])
def test_block_pick_is_checked_by_one_timing_against_csr(monkeypatch, csr_ms, block_ms, kept):
    """The cost model's block or hybrid pick runs only when its forward+backward measures at least
    MEASURED_MARGIN faster than the CSR kernels' at the first call; otherwise the CSR decision, with both times and
    the reason."""
    monkeypatch.setenv(attention_paths.CALLS_ENV, "100000000")
    src, dst = community_graph()
    plan, args, roles, score, message, layout, items = setup(src, dst, 256)
    predicted = attention_paths.decide(layout, plan[0], plan[1], plan[3], items, torch.bfloat16)
    assert predicted.path in ("block", "hybrid"), predicted.as_dict()
    graph_state.clear()
    calls = []
    clock = {"t": 0.0}

    def forward_fn(candidate, backward=False):
        assert backward, "the check against CSR and the order's gain both time a training step"
        calls.append(candidate.path)
        if candidate.path == "csr":  # the CSR backward builds the graph's source CSR at its first call
            graph_state.state_of(plan[0], plan[1], plan[3]).slot("csr_by_src").setdefault(("timing", 0), object())
        clock["t"] += csr_ms if candidate.path == "csr" else block_ms

    monkeypatch.setattr(attention_paths.time, "perf_counter", lambda: clock["t"] / 1e3)
    decision = attention_paths.decide(layout, plan[0], plan[1], plan[3], items, torch.bfloat16, forward_fn)
    assert calls.count("csr") == 4 and len(calls) >= 8  # a warm-up and three timed calls each
    assert calls[-8:] == ["csr", predicted.path] * 4, calls  # interleaved: a drift hits both alike
    assert (decision.path != "csr") == kept, decision.as_dict()
    entry = graph_state.state_of(plan[0], plan[1], plan[3])
    if not kept:
        assert not entry.slot("formats")
    # a kept block or hybrid pick never runs the split CSR backward (the hybrid's CSR rows take the atomic one): the
    # source CSR built for the timings is dropped
    assert (("timing", 0) in entry.slot("csr_by_src")) == (decision.path == "csr"), decision.path
    assert decision.measured_forward_ms["csr fwd+bwd (vs csr)"] == pytest.approx(csr_ms)
    if not kept:
        assert decision.reason.startswith("measured at the first call"), decision.reason
        assert decision.blocks is None and decision.predicted_ms  # the prediction stays in the record


def _scripted(monkeypatch, predicted: dict, measured: dict):
    """The cost model's predictions per order (``{order: (block or hybrid ms, csr ms)}``, every dense-capable window
    chosen) and the first call's timings per candidate (``{(path, order): ms}``, on a fake clock); returns the list
    of candidates ``forward_fn`` ran and ``forward_fn``."""
    real_format = attention_paths._format
    last, ran, clock = {}, [], {"t": 0.0}

    def fmt(entry, name):
        last["name"] = name
        return real_format(entry, name)

    def choose(blocks, rowptr, precision, scale, mode, family, locality):
        mode_ms, csr_ms = predicted[last["name"]]
        return blocks.dense_ok.clone(), {mode: mode_ms, "csr": csr_ms}

    def forward_fn(candidate, backward=False):
        ran.append((candidate.path, candidate.order))
        clock["t"] += measured[("csr", "none") if candidate.path == "csr" else ("block", candidate.order)]

    monkeypatch.setattr(attention_paths, "_format", fmt)
    monkeypatch.setattr(attention_paths, "_choose_windows", choose)
    monkeypatch.setattr(attention_paths.time, "perf_counter", lambda: clock["t"] / 1e3)
    return ran, forward_fn


@pytest.mark.parametrize("predicted_block, block_ms, expected", [
    (1.10, 0.8, "block"),   # predicted 10% behind CSR (in doubt): timed, measured 20% ahead, kept
    (1.10, 0.98, "csr"),    # in doubt, measured under MEASURED_MARGIN ahead: CSR
    (1.20, 0.5, "csr"),     # predicted 20% behind: CSR, nothing timed
])
def test_close_csr_prediction_is_timed(monkeypatch, predicted_block, block_ms, expected):
    """Where the cost model predicts the CSR kernel faster by less than PREDICTED_DOUBT, the block or hybrid
    candidate is built and timed against CSR at the first call, as a predicted block pick is (on the H200, bf16
    GATConv on the TU batch: predicted 10% behind CSR, timed 1.22x ahead at the first call and 1.11x per step).
    Without a first-call timing (``forward_fn`` None) the prediction alone decides: CSR."""
    monkeypatch.setenv("GNN_IO_REORDER", "off")
    src, dst = community_graph()
    plan, args, roles, score, message, layout, items = setup(src, dst, 256)
    ran, forward_fn = _scripted(monkeypatch, {"none": (predicted_block, 1.0)},
                                {("csr", "none"): 1.0, ("block", "none"): block_ms})
    decision = attention_paths.decide(layout, plan[0], plan[1], plan[3], items, torch.bfloat16, forward_fn)
    assert decision.path == expected, decision.as_dict()
    in_doubt = predicted_block < 1 + attention_paths.PREDICTED_DOUBT
    assert bool(ran) == in_doubt and len(ran) == (8 if in_doubt else 0), ran
    if expected == "block":
        assert "timed against it" in decision.reason and "10%" in decision.reason, decision.reason
    elif in_doubt:
        assert decision.reason.startswith("measured at the first call"), decision.reason
    else:
        assert decision.reason == "cost model: the CSR kernel is predicted faster", decision.reason
    if expected == "csr":  # the candidate's block format, built for the timing or the prediction: not kept
        assert not graph_state.state_of(plan[0], plan[1], plan[3]).slot("formats")
    graph_state.clear()
    untimed = attention_paths.decide(layout, plan[0], plan[1], plan[3], items, torch.bfloat16)
    assert untimed.path == "csr" and untimed.reason == "cost model: the CSR kernel is predicted faster", untimed


@pytest.mark.parametrize("rcm_predicted, rcm_ms, order", [
    (1.97, 0.5, "none"),    # the best order (degree) predicted 2% ahead of none: under ORDER_MIN_GAIN, not timed
    (1.50, 0.98, "none"),   # rcm predicted 25% ahead, measured 2% ahead: dropped, with the measured times
    (1.50, 0.60, "rcm"),    # predicted 25% ahead, measured 40% ahead: applied
])
def test_order_needs_its_gain_predicted_and_measured(monkeypatch, rcm_predicted, rcm_ms, order):
    """An order is applied only where its predicted gain and its gain measured at the first call (forward and
    backward, against the identity order's own pick) are each at least ORDER_MIN_GAIN of the op's time; otherwise
    the identity order runs, and the report keeps both orders' predictions (and timings, where taken)."""
    monkeypatch.setenv(attention_paths.CALLS_ENV, "100000000")
    src, dst = community_graph()
    plan, args, roles, score, message, layout, items = setup(src, dst, 256)
    ran, forward_fn = _scripted(monkeypatch, {"none": (2.0, 3.0), "degree": (1.96, 3.0), "rcm": (rcm_predicted, 3.0)},
                                {("csr", "none"): 3.0, ("block", "none"): 1.0, ("block", "rcm"): rcm_ms,
                                 ("block", "degree"): 0.5})
    decision = attention_paths.decide(layout, plan[0], plan[1], plan[3], items, torch.bfloat16, forward_fn)
    assert decision.path == "block" and decision.order == order, decision.as_dict()
    timed_order = rcm_predicted < 1.9
    assert (("block", "rcm") in ran) == timed_order, ran
    assert ("block", "degree") not in ran
    assert {"hybrid[none]", "hybrid[degree]", "hybrid[rcm]", "csr"} <= set(decision.predicted_ms), decision.predicted_ms
    assert ("rcm fwd+bwd" in decision.measured_forward_ms) == timed_order, decision.measured_forward_ms
    assert "block fwd+bwd (vs csr)" in decision.measured_forward_ms  # the kept pick still checked against CSR
    assert ("rcm order dropped" in decision.reason) == (timed_order and order == "none"), decision.reason
    entry = graph_state.state_of(plan[0], plan[1], plan[3])
    assert set(entry.slot("formats")) == {order}, set(entry.slot("formats"))
    assert (decision.blocks is not None and decision.transposed is not None)


def test_dropped_order_is_reported_when_csr_wins(monkeypatch):
    """An order dropped by its measured gain, then the identity order's pick losing to CSR: the CSR decision's reason
    keeps both records, and no block format stays."""
    monkeypatch.setenv(attention_paths.CALLS_ENV, "100000000")
    src, dst = community_graph()
    plan, args, roles, score, message, layout, items = setup(src, dst, 256)
    _, forward_fn = _scripted(monkeypatch, {"none": (2.0, 3.0), "degree": (2.0, 3.0), "rcm": (1.5, 3.0)},
                              {("csr", "none"): 0.5, ("block", "none"): 1.0, ("block", "rcm"): 0.99})
    decision = attention_paths.decide(layout, plan[0], plan[1], plan[3], items, torch.bfloat16, forward_fn)
    assert decision.path == "csr" and decision.order == "none", decision.as_dict()
    assert decision.reason.startswith("measured at the first call"), decision.reason
    assert "the rcm order dropped" in decision.reason, decision.reason
    assert {"rcm fwd+bwd", "none fwd+bwd", "csr fwd+bwd (vs csr)"} <= set(decision.measured_forward_ms)
    assert not graph_state.state_of(plan[0], plan[1], plan[3]).slot("formats")


def test_first_call_inside_a_cuda_graph_capture_takes_csr_uncached(monkeypatch):
    """A plan met first while a CUDA graph is being captured (a new edge_index under GNN_IO_CUDAGRAPHS=1) cannot
    build a block format or time anything there: the CSR kernel runs, with the reason, and nothing is cached, so
    the first call outside a capture still decides (a forced path included)."""
    monkeypatch.setenv(attention_paths.PATH_ENV, "block")
    src, dst = community_graph()
    plan, args, roles, score, message, layout, items = setup(src, dst, 256)
    monkeypatch.setattr(attention_paths, "capturing", lambda device: True)
    during = attention_paths.decide(layout, plan[0], plan[1], plan[3], items, torch.bfloat16)
    assert during.path == "csr" and "CUDA-graph capture" in during.reason
    assert not graph_state.state_of(plan[0], plan[1], plan[3]).slot("decisions")
    monkeypatch.setattr(attention_paths, "capturing", lambda device: False)
    assert attention_paths.decide(layout, plan[0], plan[1], plan[3], items, torch.bfloat16).path == "block"
