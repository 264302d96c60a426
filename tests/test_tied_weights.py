"""XLA157: weights tied between modules stay tied on the XLA device (the
rule's own examples run in test_rules; the golden is fixtures/tied_weights)."""

import pytest

from xlaport.engine import Settings, transform

from test_runnable_ports import needs_xla, run_on_xla

SWAP = "torch.__future__.set_swap_module_params_on_conversion(True)"

LM = ('"""A model."""\n\nimport torch.nn as nn\n\nVOCAB = 16\n\n\nclass LM(nn.Module):\n    def __init__(self, tie):\n'
      "        super().__init__()\n        self.wte = nn.Embedding(VOCAB, 4)\n"
      "        self.lm_head = nn.Linear(4, VOCAB, bias=False)\n        if tie:\n"
      "            self.lm_head.weight = self.wte.weight\n")


def test_a_tie_in_a_class_turns_on_swapping_once_after_the_imports():
    out = transform(LM.encode(), Settings())
    code = out.code.decode()
    # `torch` itself is imported for it; the switch follows the imports, before any model is made
    assert code.startswith('"""A model."""\n\nimport torch.nn as nn\nimport torch\n\n' + SWAP + "\n\nVOCAB = 16\n"), code
    assert [(f.code, f.line) for f in out.findings] == [("XLA157", 14)]
    again = transform(out.code, Settings())
    assert again.code == out.code and not again.findings
    # a module's own parameter, a tie outside a class, the same name twice: no tie rewritten
    for other in ("self.lm_head.weight = nn.Parameter(self.wte.weight.clone())",
                  "self.lm_head.weight = self.lm_head.weight", "self.lm_head.weight = self.wte.bias"):
        assert "XLA157" not in [f.code for f in transform(LM.replace(
            "self.lm_head.weight = self.wte.weight", other).encode(), Settings()).findings], other
    # a bias shared with the head's own parameter (BERT's prediction head) is a tie too
    bias = LM.replace("self.lm_head.weight = self.wte.weight", "self.lm_head.bias = self.bias")
    assert [f.code for f in transform(bias.encode(), Settings()).findings] == ["XLA157"]


@pytest.mark.xla
@needs_xla
def test_the_converted_model_keeps_one_weight_on_xla(tmp_path):
    """Without the switch `.to(xla)` gives the head a weight of its own:
    4 parameters, untied (measured: 'parameters 4 tied False')."""
    _, out, _, _ = run_on_xla("tied_weights", tmp_path, "--steps", "2")
    assert "parameters 3 tied True" in out, out


HF = ("import torch\nfrom transformers import AutoModelForCausalLM\n\n\ndef load(device):\n"
      "    model = AutoModelForCausalLM.from_pretrained('gpt2')\n    model.to(device)\n    return model\n\n\n"
      "class Runner:\n    def __init__(self):\n        self.model = AutoModelForCausalLM.from_pretrained('gpt2')\n\n"
      "    def place(self):\n        self.model = self.model.to(torch.device('cuda'))\n")


def test_a_transformers_model_moved_to_the_device_is_re_tied_after_the_move():
    out = transform(HF.replace("model.to(device)", "model.to('cuda')").encode(), Settings())
    code = out.code.decode()
    assert "    model.to(torch_xla.device())\n    model.tie_weights()\n    return model\n" in code, code
    assert "        self.model = self.model.to(torch_xla.device())\n        self.model.tie_weights()\n" in code, code
    assert [(f.code, f.line) for f in out.findings if f.code == "XLA157"] == [("XLA157", 7), ("XLA157", 16)]
    assert transform(out.code, Settings()).code == out.code  # re-tied once
    # a move to a dtype, or of a model the program builds itself: nothing
    dtype = transform(HF.replace("model.to(device)", "model.to(torch.float16)").encode(), Settings()).code.decode()
    assert "    model.to(torch.float16)\n    return model\n" in dtype and dtype.count("tie_weights") == 1, dtype
    own = HF.replace("AutoModelForCausalLM.from_pretrained('gpt2')", "torch.nn.Linear(2, 2)")
    assert "tie_weights" not in transform(own.encode(), Settings()).code.decode()


@pytest.mark.xla
@needs_xla
def test_the_library_model_stays_tied_on_xla(tmp_path):
    """fixtures/tied_library_model: without the re-tie, 'parameters 17 tied False'."""
    _, out, _, _ = run_on_xla("tied_library_model", tmp_path, "--steps", "2")
    assert "parameters 16 tied True" in out, out


def test_old_weight_norm_blocks_the_swap_and_the_finding_says_why():
    """`torch.nn.utils.weight_norm` keeps a computed weight holding its
    parameters: under the swapping conversion `.to(<XLA device>)` fails
    ("Couldn't swap Linear.weight_g", measured on torch 2.9).  Where the
    module uses it, XLA133/XLA157 report instead of turning swapping on."""
    src = ("import torch\n\nnet = torch.nn.utils.weight_norm(torch.nn.Linear(3, 3))\n"
           "opt = torch.optim.SGD(net.parameters(), lr=0.1)\nnet.cuda()\n")
    outcome = transform(src.encode(), Settings())
    assert b"set_swap_module_params_on_conversion" not in outcome.code
    [early] = [f for f in outcome.findings if f.code == "XLA133"]
    assert not early.fix and "weight_norm" in early.message
    tied = ("import torch\nimport torch.nn as nn\n\n\nclass LM(nn.Module):\n    def __init__(self):\n"
            "        super().__init__()\n        self.embed = nn.Embedding(10, 4)\n"
            "        self.head = nn.utils.weight_norm(nn.Linear(4, 10, bias=False))\n"
            "        self.head.weight = self.embed.weight\n")
    outcome = transform(tied.encode(), Settings())
    assert b"set_swap_module_params_on_conversion" not in outcome.code
    assert [f.fix for f in outcome.findings if f.code == "XLA157"] == [False]


@pytest.mark.parametrize("spelling", [
    "from torch.nn.utils import weight_norm\n\nconv = weight_norm(nn.Conv1d(4, 4, 3))\n",
    "import torch.nn as nn\n\nconv = nn.utils.weight_norm(nn.Conv1d(4, 4, 3))\n",
])
def test_old_weight_norm_in_a_module_this_one_imports_blocks_the_swap_too(tmp_path, spelling):
    """TCN's word-level model ties its decoder to its embedding and builds its
    layers with `weight_norm` in `tcn.py`: with the swap turned on, the
    conversion died at `model.to(xla)` ("Couldn't swap Conv1d.weight_g")."""
    (tmp_path / "layers.py").write_text("import torch.nn as nn\n" + spelling)
    model = tmp_path / "model.py"
    model.write_text(LM.replace("import torch.nn as nn\n", "import torch.nn as nn\n\nfrom layers import conv\n"))
    out = transform(model.read_bytes(), Settings(), filename=str(model))
    tie = [f for f in out.findings if f.code == "XLA157"]
    assert len(tie) == 1 and not tie[0].fix and "in `layers`, which this module imports" in tie[0].message, tie
    assert SWAP not in out.code.decode()
    (tmp_path / "layers.py").write_text(spelling.replace("nn.utils.weight_norm", "nn.utils.parametrizations.weight_norm")
                                        .replace("from torch.nn.utils import", "from torch.nn.utils.parametrizations import"))
    out = transform(model.read_bytes(), Settings(), filename=str(model))  # its successor swaps
    assert SWAP in out.code.decode()
