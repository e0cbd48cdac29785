import json

from benchmarks import bucket_reuse
from gnn_inductor import buckets


def test_a_rare_smaller_size_rides_the_compiled_bucket_and_a_recurring_one_compiles():
    big, small = (300, 900), (200, 600)
    rare = [big] * 3 + [small] + [big] * (buckets.RECENT_CALLS + 1) + [small]
    assert bucket_reuse.simulate(rare, warmup=2)["compiles"] == 1
    assert bucket_reuse.simulate(rare, warmup=2, far_reuse=1.0)["compiles"] == 2
    recurring = [big, small, small]
    result = bucket_reuse.simulate(recurring, warmup=2)
    assert result["compiled_at"] == [0, 2] and result["after_warmup"] == 1


def test_after_the_buckets_settle_a_rare_size_runs_unpadded_and_a_recurring_one_compiles():
    big, outlier, tiny = (300, 900), (600, 2400), (40, 100)
    settled = [big] * buckets.SETTLE_CALLS
    # the settling call compiles the bucket one step above; the outlier is larger than both, the tiny graph rides
    result = bucket_reuse.simulate(settled + [outlier, big, tiny, outlier], warmup=buckets.SETTLE_CALLS)
    assert result["compiled_at"] == [0, buckets.SETTLE_CALLS - 1] and result["unpadded_calls"] == 2
    ahead = tuple(buckets.bucket(size) for size in buckets.padded_sizes(*big))
    assert buckets.padded_sizes(*big)[1] < ahead[1] < buckets.padded_sizes(*outlier)[1]
    # the same outlier and tiny graph before the buckets settle compile their own
    assert bucket_reuse.simulate([big] * 3 + [outlier, tiny], warmup=2)["compiled_at"] == [0, 3, 4]
    # a size that comes back RECUR times within RECENT_CALLS calls compiles after all (the sizes drifted)
    result = bucket_reuse.simulate(settled + [outlier] * buckets.RECUR, warmup=buckets.SETTLE_CALLS)
    assert result["unpadded_calls"] == buckets.RECUR - 1
    assert result["compiled_at"] == [0, buckets.SETTLE_CALLS - 1, len(settled) + buckets.RECUR - 1]
    never = bucket_reuse.simulate(settled + [outlier, big, tiny, outlier], warmup=buckets.SETTLE_CALLS, settle=False)
    assert never["after_warmup"] == 2 and never["unpadded_calls"] == 0


def test_padding_is_the_mean_over_calls_of_the_bucket_against_the_real_sizes():
    nodes, edges = buckets.padded_sizes(300, 900)
    result = bucket_reuse.simulate([(300, 900), (300, 900)], warmup=0)
    assert result["node_padding"] == nodes / 300 - 1 and result["edge_padding"] == edges / 900 - 1


def test_the_script_runs_both_policies_on_sampled_batches(tmp_path):
    out = tmp_path / "reuse.json"
    records = bucket_reuse.main(["--graph", "rmat-small", "--batch", "16", "--fanout", "4,3", "--calls", "30",
                                 "--warmup", "10", "--seeds", "0", "--out", str(out)])
    assert [r["policy"] for r in records] == ["reuse, settled", "reuse, never settled", "near reuse only"]
    assert all(r["compiles"] >= 1 and 0 < r["node_padding"] for r in records)
    assert json.loads(out.read_text())["records"] == records
