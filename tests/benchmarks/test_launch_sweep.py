"""benchmarks/launch_sweep.py: the launches it sweeps and the tables it changes (the step itself runs on a GPU)."""
import pytest

from benchmarks import launch_sweep
from gnn_inductor.kernels.attention import csr_launch


@pytest.mark.parametrize("family", ["gat", "dot"])
def test_each_launch_is_swept_once_with_the_defaults_first_and_last(family):
    forward, backward = csr_launch.ALL_HEADS_FORWARD_LAUNCH[family], csr_launch.SPLIT_BACKWARD_LAUNCH[family]
    runs = launch_sweep.launches(family)
    assert runs[0] == ("default", forward, backward) and runs[-1] == ("default again", forward, backward)
    swept = runs[1:-1]
    assert len({name for name, _, _ in swept}) == len(swept)
    for name, f, (dst, src) in swept:  # one table entry off its default per run
        assert [f != forward, dst != backward[0], src != backward[1]].count(True) == 1, name


def test_launch_tables_are_restored_after_the_block_and_after_an_error():
    saved = dict(csr_launch.ALL_HEADS_FORWARD_LAUNCH), dict(csr_launch.SPLIT_BACKWARD_LAUNCH)
    with launch_sweep.launch_tables("gat", (512, 4), ((128, 1), (128, 2))):
        assert csr_launch.ALL_HEADS_FORWARD_LAUNCH["gat"] == (512, 4)
        assert csr_launch.SPLIT_BACKWARD_LAUNCH["gat"] == ((128, 1), (128, 2))
    with pytest.raises(RuntimeError):
        with launch_sweep.launch_tables("gat", (128, 1), ((128, 1), (128, 1))):
            raise RuntimeError("a step failed")
    assert (csr_launch.ALL_HEADS_FORWARD_LAUNCH, csr_launch.SPLIT_BACKWARD_LAUNCH) == saved
