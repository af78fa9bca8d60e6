"""A self-contained HTML page showing the order in which a diffusion LM unmasked the tokens of one sample.

Each generated token is a cell coloured by the step at which it was fixed (early = dark, late = light) and labelled
with that step; cells are grouped by block. A slider replays the decoding: tokens not yet fixed show as a mask.

    write_trajectory_html("trajectory.html", tokenizer, rollout.completion_ids[0], rollout.step_map[0], block=32)
"""

import html
import json


def write_trajectory_html(path: str, tokenizer, token_ids, step_map, block: int | None = None,
                          title: str = "Decoding order") -> str:
    ids, steps = [int(t) for t in token_ids], [int(s) for s in step_map]
    if len(ids) != len(steps):
        raise ValueError(f"{len(ids)} tokens but {len(steps)} step entries")
    cells = [{"text": tokenizer.decode([t]), "step": s} for t, s in zip(ids, steps) if s >= 0]
    last = max((c["step"] for c in cells), default=0)
    data = json.dumps(cells).replace("</", "<\\/")  # a token "</script>" must not end the script element
    page = _PAGE.replace("__TITLE__", html.escape(title)).replace("__CELLS__", data) \
        .replace("__BLOCK__", str(block or len(cells) or 1)).replace("__LAST__", str(last))
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em; }
.block { border: 1px solid #bbb; border-radius: 6px; padding: 6px; margin: 6px 0; display: flex; flex-wrap: wrap; }
.cell { margin: 2px; padding: 2px 4px; border-radius: 4px; font-family: monospace; white-space: pre; }
.cell small { display: block; font-size: 9px; opacity: .7; }
.masked { background: #eee !important; color: #999 !important; }
</style></head><body>
<h2>__TITLE__</h2>
<p>Colour and small number: the step at which each token was fixed (darker = earlier). Boxes are blocks.</p>
<label>step <input id="s" type="range" min="0" max="__LAST__" value="__LAST__"> <span id="v"></span></label>
<div id="t"></div>
<script>
const cells = __CELLS__, block = __BLOCK__, last = Math.max(__LAST__, 1);
const t = document.getElementById("t"), s = document.getElementById("s"), v = document.getElementById("v");
function draw() {
  const upto = +s.value; v.textContent = upto + " / " + __LAST__; t.innerHTML = "";
  for (let b = 0; b < cells.length; b += block) {
    const box = document.createElement("div"); box.className = "block";
    for (const c of cells.slice(b, b + block)) {
      const e = document.createElement("span"), shade = Math.round(40 + 200 * c.step / last);
      e.className = "cell" + (c.step > upto ? " masked" : "");
      e.style.background = `rgb(${shade}, ${Math.round(shade * 0.8 + 40)}, 255)`;
      e.style.color = shade < 140 ? "white" : "black";
      e.textContent = c.step > upto ? "[M]" : c.text;
      const n = document.createElement("small"); n.textContent = c.step; e.appendChild(n);
      box.appendChild(e);
    }
    t.appendChild(box);
  }
}
s.oninput = draw; draw();
</script></body></html>
"""
