"""Progress bars that cannot simply go (XLA201/XLA202): a bar the code keeps
using -- stored, passed on, read -- is reported where it is made and left in
place, with its updates; removing it would leave a name that is never bound
(diffusers' modular chunk loops store the bar in their block state)."""

import ast

from tests.conftest import convert_text

HEAD = "import torch\nfrom tqdm import tqdm\n\n\n"


def _codes(findings, fix):
    return sorted((f.code, f.line) for f in findings if f.fix is fix)


def test_a_with_bar_stored_elsewhere_is_reported_and_kept():
    src = HEAD + ("def run(state, timesteps, x, step):\n"
                  "    with tqdm(total=len(timesteps)) as bar:\n"
                  "        state.bar = bar\n"
                  "        for t in timesteps:\n"
                  "            x = step(x, t)\n"
                  "            bar.update()\n"
                  "    return x\n")
    out, findings = convert_text(src)
    ast.parse(out)
    assert "with tqdm(total=len(timesteps)) as bar:" in out and "state.bar = bar" in out
    assert "bar.update()" in out, out
    assert ("XLA202", 6) in _codes(findings, False)
    assert not [f for f in findings if f.code == "XLA202" and f.fix]


def test_an_assigned_bar_read_beyond_updates_is_reported_and_kept():
    src = HEAD + ("def run(timesteps, x, step):\n"
                  "    pbar = tqdm(timesteps)\n"
                  "    for t in pbar:\n"
                  "        x = step(x, t)\n"
                  "        pbar.write(str(pbar.n))\n"
                  "    return x\n")
    out, findings = convert_text(src)
    assert "pbar = tqdm(timesteps)" in out and "from tqdm import tqdm" in out, out
    message = next(f.message for f in findings if f.code == "XLA201")
    assert "line 9" in message, message


def test_a_bar_only_iterated_and_updated_still_goes():
    src = HEAD + ("def run(timesteps, x, step):\n"
                  "    with tqdm(total=3) as bar:\n"
                  "        for t in timesteps:\n"
                  "            x = step(x, t)\n"
                  "            bar.update()\n"
                  "    pbar = tqdm(timesteps)\n"
                  "    for t in pbar:\n"
                  "        x = step(x, t)\n"
                  "        pbar.set_description(str(t))\n"
                  "    return x\n")
    out, findings = convert_text(src)
    ast.parse(out)
    assert "tqdm" not in out and "bar.update" not in out, out
    assert _codes(findings, False) == []


def test_findings_inside_a_bar_block_are_on_the_users_lines_and_columns():
    """The loop rules read the loop where the user wrote it, inside its
    `with` block (the block goes after them): each finding's span is the
    code it names in the user's file (denoising-diffusion-pytorch's trainer
    had its `.item()` and its barrier reported four columns to the left)."""
    src = HEAD + ("def train(model, opt, data, steps):\n"
                  "    total = 0.0\n"
                  "    with tqdm(total=steps) as pbar:\n"
                  "        for x in data:\n"
                  "            loss = model(x)\n"
                  "            loss.backward()\n"
                  "            opt.step()\n"
                  "            total += loss.item()\n"
                  "            pbar.update(1)\n"
                  "    return total\n")
    out, findings = convert_text(src)
    lines = src.splitlines()
    summed = next(f for f in findings if f.code == "XLA412")  # the sum moved to the device
    assert lines[summed.line - 1][summed.col - 1:summed.end_col - 1] == "total += loss.item()"
    loop = next(f for f in findings if f.code == "XLA302")
    assert lines[loop.line - 1][loop.col - 1:].startswith("for x in data:")
    assert "with tqdm" not in out and "torch_xla.sync()" in out


def test_a_bar_block_whose_loop_gained_a_barrier_ends_on_the_users_last_line():
    src = HEAD + ("class Pipe:\n"
                  "    def __call__(self, unet, scheduler, latents, timesteps):\n"
                  "        with self.progress_bar(total=len(timesteps)) as progress_bar:\n"
                  "            for t in timesteps:\n"
                  "                noise = unet(latents, t)\n"
                  "                latents = scheduler.step(noise, t, latents)\n"
                  "                progress_bar.update()\n"
                  "\n"
                  "        return latents\n")
    out, findings = convert_text(src)
    assert "torch_xla.sync()" in out and "progress_bar" not in out, out
    lines = src.splitlines()
    block = next(f for f in findings if f.code == "XLA202" and "block" in f.message)
    loop = next(f for f in findings if f.code == "XLA302")
    for span in (block, loop):
        assert (span.end_line, span.end_col) == (11, len(lines[10]) + 1), (span.code, span.end_line, span.end_col)


def test_the_comment_above_a_removed_import_stays():
    """LibCST's RemoveImportsVisitor drops the comment lines above an import
    statement it removes; they stay (above the next statement, or at the end
    of the block), as Ruff's fix of an unused import keeps them."""
    src = ("import os\n\n# a progress bar tool, explained\nfrom tqdm import tqdm  # (this goes with it)\nimport torch\n\n"
           "def f():\n    # the bar, again\n    from tqdm import tqdm\n\n    for x in tqdm(range(3)):\n"
           "        print(x, os.sep, torch.ones(1).cuda())\n\n\n"
           "for x in tqdm(range(3)):\n    print(x)\n")
    out, findings = convert_text(src)
    assert "tqdm" not in out, out
    assert "# a progress bar tool, explained\nimport torch\n" in out
    assert "def f():\n    # the bar, again\n\n    for x in range(3):\n" in out
    assert "(this goes with it)" not in out  # (the statement's own comment: Ruff's fix takes it too)
    assert [f.code for f in findings if f.code == "XLA201"] == ["XLA201", "XLA201"]
    assert convert_text(out)[0] == out
