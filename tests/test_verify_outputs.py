"""verify's output comparison without running anything (no torch_xla needed)."""

from xlaport.verify.outputs import Comparison, compare_text


def test_timings_are_left_out_even_when_two_reference_runs_print_the_same_value():
    """Two fast reference runs can both print `time: 0.004s`: a timing is
    recognised by its unit or the word before it, not only by varying."""
    ref = "step 0 | 12.34 ms/batch | 81.0 it/s\nloss 0.08485 time: 0.004s\n"
    cand = "step 0 | 55.10 ms/batch | 18.2 it/s\nloss 0.08485 time: 0.020s\n"
    out = Comparison()
    compare_text("stdout", [ref, ref], cand, 1e-3, 1e-5, out)
    assert all(o.ok for o in out.outputs), out.outputs
    assert len(out.varies) == 3
    # the step index and the loss are still compared
    wrong = Comparison()
    compare_text("stdout", [ref, ref], cand.replace("0.08485", "0.09999"), 1e-3, 1e-5, wrong)
    assert [o.ok for o in wrong.outputs] == [True, False]


def test_numbers_that_differ_between_reference_runs_are_left_out():
    out = Comparison()
    compare_text("stdout", ["seed 17 loss 1.5\n", "seed 23 loss 1.5\n"], "seed 99 loss 1.5\n", 1e-3, 1e-5, out)
    assert all(o.ok for o in out.outputs) and out.varies == ["stdout line 1, number 1: seed 17 loss 1.5"]
