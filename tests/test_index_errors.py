"""XLA161 (codemods/index_errors.py): an int index whose IndexError the
program catches takes a 0-dim tensor on the host.  torch_xla 2.9 kills the process for
an int index of a 0-dimensional device tensor instead of raising, and
TeaPearce's conditional-diffusion sampler relies on that IndexError: its
conversion died (SIGSEGV) after the first sampling."""

import pytest

from tests.conftest import convert_text

from test_recompile_fixes import codes

from test_switches import HAVE_XLA, _original_and_conversion

PROGRAM = '''\
import torch

device = "cuda" if torch.cuda.is_available() else "cpu"
c = torch.tensor([3, 1, 3, 0, 0]).to(device)
x = torch.arange(5.0).to(device)
picked = []
for k in range(4):
    for j in range(2):
        try:
            idx = torch.squeeze((c == k).nonzero())[j]
        except:
            idx = 0
        picked.append(float(x[idx]))
print(picked)
'''



def test_a_caught_index_takes_a_0_dim_tensor_on_the_host():
    out, findings = convert_text(PROGRAM)
    assert codes(findings, "XLA161") == [(10, True)], findings
    assert ("        try:\n            indexed = torch.squeeze((c == k).nonzero())\n"
            "            idx = (indexed if indexed.dim() else indexed.cpu())[j]\n        except:\n") in out, out
    again, findings = convert_text(out)
    assert again == out and not codes(findings, "XLA161")


@pytest.mark.parametrize("handler", ["except Exception:", "except (KeyError, IndexError):", "except LookupError:",
                                     "except builtins.IndexError:", "except IndexError as e:"])
def test_each_handler_that_catches_index_error(handler):
    out, findings = convert_text(PROGRAM.replace("except:", handler))
    assert codes(findings, "XLA161") == [(10, True)], findings


def test_the_name_it_binds_is_one_the_module_does_not_use():
    out, findings = convert_text(PROGRAM.replace("picked = []\n", "picked = []\nindexed = 1\n"))
    assert "indexed_1 = torch.squeeze((c == k).nonzero())\n" in out and "indexed = 1\n" in out, out


def test_on_a_line_with_other_statements_it_is_reported_not_rewritten():
    out, findings = convert_text(PROGRAM.replace("            idx = torch.squeeze", "            n = 1; idx = torch.squeeze"))
    assert codes(findings, "XLA161") == [(10, False)], findings
    assert "indexed" not in out


@pytest.mark.parametrize("change", [
    ("except:", "except KeyError:"),  # IndexError is not caught there
    ("torch.squeeze((c == k).nonzero())[j]", "torch.zeros(3)[j]"),  # on the host already
    ("torch.squeeze((c == k).nonzero())[j]", "[1, 2][j]"),  # no tensor
    ("torch.squeeze((c == k).nonzero())[j]", "c[c > 0]"),  # no int index
    ("torch.squeeze((c == k).nonzero())[j]", "torch.squeeze((c == k).nonzero())[c[0]]"),  # a tensor index
    ("torch.squeeze((c == k).nonzero())[j]", "torch.squeeze((c == k).nonzero()).cpu()[j]"),  # on the host by hand
    ("            idx = torch.squeeze((c == k).nonzero())[j]\n",  # in a function the try only defines
     "            def f():\n                return torch.squeeze((c == k).nonzero())[j]\n            idx = f()\n"),
])
def test_what_is_no_caught_int_index_of_a_device_tensor_is_left(change):
    src = PROGRAM.replace(*change)
    assert src != PROGRAM
    out, findings = convert_text(src)
    assert not codes(findings, "XLA161"), findings


def test_a_module_not_being_ported_is_left():
    src = PROGRAM.replace('"cuda" if torch.cuda.is_available() else "cpu"', '"cpu"')
    out, findings = convert_text(src)
    assert not codes(findings, "XLA161") and out == src


def test_an_index_in_the_handler_is_not_the_one_caught():
    src = PROGRAM.replace("            idx = 0\n", "            idx = torch.squeeze((c == k).nonzero())[0]\n")
    out, findings = convert_text(src)
    assert codes(findings, "XLA161") == [(10, True)], findings  # (the try's own, not the handler's)
    assert "            idx = torch.squeeze((c == k).nonzero())[0]\n" in out


@pytest.mark.xla
@pytest.mark.skipif(not HAVE_XLA, reason="needs torch_xla (make setup)")
def test_the_program_that_catches_the_index_error_runs_on_xla_as_on_the_cpu(tmp_path):
    """Class 1 is met once: `squeeze` leaves a 0-dim tensor, and its `[1]`
    raised IndexError on the CPU but killed the converted process on XLA."""
    original, converted = _original_and_conversion(PROGRAM, tmp_path)
    assert converted == original == "[3.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0]\n"
