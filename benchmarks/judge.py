"""How the barrier benchmark and the harm audit judge a barrier xlaport adds.

Each loop is put in a category read from its own level (its body without
its nested loops and functions), and each category carries the verdict
given after reading every loop that fell in it (on diffusers 0.42.1,
transformers 4.57.6, accelerate 1.1.1, timm 1.0.11):

* ``denoise``: it steps a scheduler (``*scheduler*.step*``) or runs a
  modular pipeline's per-timestep sub-blocks (``loop_step`` over timesteps);
* ``train``: it calls ``.backward()`` or a function that does;
* ``feedback``: it runs a model (``self``, ``model``, ``self.unet``, a
  language model, ``lm_head``...) and carries its output to the next
  iteration: token-by-token generation, score-SDE corrector steps;
* ``outer``: it runs sub-blocks per chunk/segment (``loop_step`` over
  anything but timesteps): the denoising loops are inside those blocks;
* ``step-fn``: not a loop but a statement of a function that takes a step
  (``backward`` before it, to any depth of the module's calls): the barrier
  before the host reads that follow the step;
* ``check``: none of these -- each such loop is judged one by one in
  ``READ`` (an unjudged one is reported as such); ``READ`` also overrides a
  category's verdict for a loop read and judged otherwise.

The ``denoise`` loops were read as a list of their headers and their
scheduler-step lines (every one iterates timesteps or sigmas and writes the
scheduler's output back, except panorama's per-view loop, in ``READ``).
"""

from __future__ import annotations

import ast
import re
from typing import Dict, List, Tuple

_SCHEDULER_STEP = re.compile(r"scheduler\w*\.(step\w*|batch_step\w*)$|^scheduler\.\w*step\w*$")
_MODEL = re.compile(r"^self$|^self\.(forward|unet|transformer\w*|prior|model|language_model)$|denois|decoder|"
                    r"^model$|^self\.model\.\w+$|language_model|lm_head|_model$")

VERDICTS: Dict[str, Tuple[str, str]] = {
    "denoise": ("real", "a denoising loop (a scheduler step per timestep) nobody ported: deprecated, modular and "
                        "newer pipelines"),
    "train": ("real", "gradient steps: DiffEdit/pix2pix-zero inversion, accelerate's gradient-sync test loops"),
    "feedback": ("real", "a model's output carried to the next iteration: token-by-token generation, "
                         "score-SDE/corrector steps"),
    "outer": ("wrong", "a chunk/segment loop around sub-blocks whose denoising loop has its own barrier: one "
                       "extra cut per chunk, harmless, but no step loop"),
    "loader": ("real", "XLA301: a loop over a DataLoader"),
    "step-fn": ("real", "a function that takes a step (a backward before the line) and reads the host after it: "
                        "the barrier before the reads (pyGAT's `train(epoch)`)"),
    "check": ("unjudged", "read it"),
}

# Loops in `check` read one by one: (path ending, loop header) -> (verdict, why).
READ: Dict[Tuple[str, str], Tuple[str, str]] = {
    ("stable_diffusion_paradigms.py", "while begin_idx < len(scheduler.timesteps):"): (
        "real", "ParaDiGMS parallel sampling: each iteration denoises a window of timesteps"),
    ("modular_pipelines/wan/encoders.py", "for reference_image in reference_images_batch:"): (
        "real", "accumulates VAE encodings into `latent` (torch.cat): without a barrier the graph grows"),
    ("stable_diffusion_panorama/pipeline_stable_diffusion_panorama.py",
     "for j, batch_view in enumerate(views_batch):"): (
        "wrong", "the per-view loop inside a denoising step (the timestep loop around it has the barrier): "
                 "one cut per view, harmless, but no step loop"),
}


def own_calls(loop: ast.AST) -> List[str]:
    calls: List[str] = []
    stack = list(loop.body)  # type: ignore[attr-defined]
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                          ast.ClassDef)):
            continue
        if isinstance(n, ast.Call):
            calls.append(ast.unparse(n.func))
        stack.extend(ast.iter_child_nodes(n))
    return calls


def classify(loop: ast.AST, step_functions: frozenset = frozenset()) -> str:
    """The category of a loop that got a barrier."""
    calls = own_calls(loop)
    over = ast.unparse(loop.iter) if isinstance(loop, (ast.For, ast.AsyncFor)) else ast.unparse(loop.test)  # type: ignore[attr-defined]
    if any(_SCHEDULER_STEP.search(c) for c in calls):
        return "denoise"
    if any(c.endswith(".backward") or c.split(".")[-1] in step_functions for c in calls):
        return "train"
    if any(c.endswith("loop_step") for c in calls):
        return "denoise" if re.search(r"timesteps|sigmas", over) else "outer"
    if any(_MODEL.search(c) for c in calls):
        return "feedback"
    return "check"


def step_functions_of(tree: ast.AST) -> frozenset:
    """Functions of a module that call ``backward``, or call (by name) a
    function that does, to any depth (written here independently of the
    rules' own closure in codemods/analysis/steps.py: this is the judge)."""
    fns = [fn for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))]
    calls = {fn.name: {ast.unparse(c.func).split(".")[-1] for c in ast.walk(fn) if isinstance(c, ast.Call)}
             for fn in fns}
    found = {name for name, called in calls.items() if "backward" in called}
    while True:
        more = {name for name, called in calls.items() if name not in found and called & found}
        if not more:
            return frozenset(found)
        found |= more


def judge(path: str, source: str, lines: List[int]) -> Dict[int, Tuple[str, str, str]]:
    """``line -> (category, verdict, why)`` for the loops at ``lines``."""
    tree = ast.parse(source)
    text = source.splitlines()
    steps = step_functions_of(tree)
    out: Dict[int, Tuple[str, str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and node.lineno in lines:
            header = text[node.lineno - 1].strip()
            category = classify(node, steps)
            read = next((v for (end, h), v in READ.items() if path.endswith(end) and h == header), None)
            verdict, why = read or VERDICTS[category]
            out[node.lineno] = (category, verdict, why)
    for line in set(lines) - set(out):  # a barrier on a statement, not a loop: in a function that takes a step?
        fns = [fn for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
               and fn.lineno < line <= (fn.end_lineno or fn.lineno)]
        fn = max(fns, key=lambda f: f.lineno, default=None)
        stepped = fn is not None and fn.name in steps and any(
            isinstance(c, ast.Call) and ast.unparse(c.func).split(".")[-1] in ("backward", "step")
            and c.lineno < line for c in ast.walk(fn))
        if stepped:
            out[line] = ("step-fn", *VERDICTS["step-fn"])
    return out
