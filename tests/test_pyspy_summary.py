"""benchmarks/pyspy_summary.py: the steps' samples kept (and a thread that never shows the step's frame, as the
autograd device thread), compile work dropped, shares by frame."""
from benchmarks.pyspy_summary import summarise

STACKS = [
    "MainThread (0x1);<module> (x/run.py:1);sampled_steps (benchmarks/cpu_profile.py:20);launch (k/launch.py:7) 6",
    "MainThread (0x1);<module> (x/run.py:1);sampled_steps (benchmarks/cpu_profile.py:20);guard (t/eval_frame.py:3) 2",
    "MainThread (0x1);<module> (x/run.py:1);warm_up (x/run.py:9) 50",  # before the steps: not kept
    "Thread 0x2 (0x2);backward (t/graph.py:860);launch (k/launch.py:7) 4",  # the autograd device thread
    "Thread 0x2 (0x2);backward (t/graph.py:860);compile_fx (t/compile_fx.py:1) 30",  # compile work: dropped
    "not a sample line",
]


def test_keeps_the_steps_and_the_device_thread():
    text = summarise(STACKS, rows=5)
    assert "| MainThread (0x1) | 58 | 8 |" in text
    assert "| Thread 0x2 (0x2) | 4 | 0 |" in text  # its compile samples dropped before counting
    assert "12 samples" in text
    assert "| 83.3 | 83.3 | launch (k/launch.py) |" in text  # 10 of 12, inclusive and self
    assert "| 16.7 | 16.7 | guard (t/eval_frame.py) |" in text
    assert "warm_up" not in text and "compile_fx" not in text


def test_keep_and_drop_are_settable():
    text = summarise(STACKS, keep="warm_up", drop="", rows=5)
    assert "| MainThread (0x1) | 58 | 50 |" in text
    assert "| Thread 0x2 (0x2) | 34 | 0 |" in text
    assert "84 samples" in text


def test_one_thread_under_two_labels_is_one_thread():
    """py-spy labels a thread without its name until it has one: those samples are the same thread's (here the
    import before the steps), not a thread that never shows the step's frame."""
    stacks = ["thread (11): MainThread;<module> (x/run.py:1);sampled_steps (benchmarks/cpu_profile.py:20);"
              "launch (k/launch.py:7) 3",
              "thread (11);<module> (x/run.py:1);import_torch (x/run.py:2) 40",
              "thread (12);backward (t/graph.py:860);launch (k/launch.py:7) 1"]
    text = summarise(stacks, rows=5)
    assert "| thread (11): MainThread | 43 | 3 |" in text
    assert "| thread (12) | 1 | 0 |" in text
    assert "4 samples" in text and "import_torch" not in text
