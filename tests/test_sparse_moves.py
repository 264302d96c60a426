"""XLA158 with the tests that choose a device: a sparse tensor the module
moves to a device anywhere keeps the test that would choose XLA for it
(XLA118, engine._switches_to_keep), and a name made dense again before it
moves keeps none (pytorch/examples' gcn and gat)."""

import pytest

from tests.conftest import convert_text

from test_switches import HAVE_XLA, _original_and_conversion


SPARSE_ELSEWHERE = '''\
import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--no-accel", action="store_true")
args = parser.parse_args()


def load(device):
    adj = torch.eye(4) + torch.ones(4, 4)
    return adj.to_sparse().to(device), torch.ones(4, 2).to(device)


use_accel = not args.no_accel and torch.accelerator.is_available()
if use_accel:
    device = torch.accelerator.current_accelerator()
else:
    device = torch.device("cpu")
adj, x = load(device)
print(torch.sparse.mm(adj, x).sum().item())
'''


def test_a_test_choosing_the_device_a_sparse_tensor_goes_to_elsewhere_is_kept():
    """pytorch/examples' gcn: the accelerator test chooses the device its
    `load_cora(device)` sends sparse tensors to, in another function: turned
    true, the conversion raised (SparseXLA) where the original ran."""
    out, findings = convert_text(SPARSE_ELSEWHERE)
    kept = [f for f in findings if f.code == "XLA118"]
    assert [f.line for f in kept] == [15] and "moving sparse" in kept[0].message, findings
    assert "torch.accelerator.is_available()" in out and "device = torch.accelerator.current_accelerator()" in out
    dense = SPARSE_ELSEWHERE.replace("adj.to_sparse().to(device)", "adj.to(device)").replace(
        "torch.sparse.mm(adj, x)", "(adj @ x)")
    out, findings = convert_text(dense)  # nothing sparse goes to the device: the test is the accelerator's
    assert "XLA118" not in [f.code for f in findings] and "torch_xla.device()" in out, out


@pytest.mark.xla
@pytest.mark.skipif(not HAVE_XLA, reason="needs torch_xla (make setup)")
def test_the_program_sending_a_sparse_tensor_runs_where_the_original_ran(tmp_path):
    original, converted = _original_and_conversion(SPARSE_ELSEWHERE, tmp_path)
    assert converted == original == "40.0\n"


def test_a_name_made_dense_again_before_it_moves_keeps_no_test():
    """pytorch/examples' gat: `adj_mat = torch.eye(V) + adj_mat` (dense plus
    sparse is dense) before `adj_mat.to(device)`: nothing sparse moves."""
    dense_again = SPARSE_ELSEWHERE.replace(
        "    adj = torch.eye(4) + torch.ones(4, 4)\n    return adj.to_sparse().to(device)",
        "    adj = torch.ones(4, 4).to_sparse()\n    adj = torch.eye(4) + adj\n    return adj.to(device)").replace(
        "torch.sparse.mm(adj, x)", "(adj @ x)")
    assert "adj = torch.eye(4) + adj" in dense_again
    out, findings = convert_text(dense_again)
    assert "XLA118" not in [f.code for f in findings] and "torch_xla.device()" in out, findings
    assert not [f for f in findings if f.code == "XLA158" and "moving sparse" in f.message]
    still = dense_again.replace("    adj = torch.eye(4) + adj\n", "    adj = adj * 2\n")  # sparse times 2 is sparse
    assert "XLA118" in [f.code for f in convert_text(still)[1]]


@pytest.mark.parametrize("head, call", [
    ("import torch", "torch.sparse.mm(a, b)"),
    ("from torch import sparse", "sparse.mm(a, b)"),
    ("import torch.sparse as ts", "ts.mm(a, b)"),
    ("from torch import sparse_coo_tensor as make", "make(i, v)"),
    ("import torch", "torch.smm(a, b)"),
    ("import torch", "torch.sspaddmm(x, a, b)"),
    ("import torch", "a.to_sparse_csr()"),
])
def test_each_spelling_of_a_sparse_tensor_is_read_past_the_prefilter(head, call):
    """The prefilter lets the rule see every way the code can name a sparse
    op (``project.SPARSE_NAMES``): findings with and without it are one."""
    source = f"{head}\n\ny = {call}\n"
    with_prefilter = [(f.code, f.line) for f in convert_text(source)[1]]
    assert with_prefilter == [("XLA158", 3)]
    assert [(f.code, f.line) for f in convert_text(source, prefilter=False)[1]] == with_prefilter


def test_a_name_holding_the_word_sparse_does_not_bring_the_rule():
    """``is_sparse``, ``sparse_attention``, a config's ``use_sparse``:
    transformers has hundreds; the rule that reports sparse tensors is not
    run on their files (they are not even parsed, where no other rule asks)."""
    from codemods import registry
    from xlaport.engine import Settings

    source = b"import torch\n\nif config.use_sparse and not x.is_sparse:\n    y = sparse_attention(x)\n"
    settings = Settings()
    names = [c.name for c in registry.applicable(source, settings.selected_codes(), settings.options, True)]
    assert "XlaLimits" not in names
    assert "XlaLimits" in [c.name for c in registry.applicable(
        source + b"z = x.to_sparse()\n", settings.selected_codes(), settings.options, True)]
