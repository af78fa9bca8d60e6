"""A self-contained HTML page showing the order in which a diffusion LM unmasked the tokens of one sample.

The page shows the prompt, then each generated token as a chip coloured by the step at which it was fixed (or by its
confidence when committed, where recorded), with a colour legend; blocks are thin boxes that wrap side by side, so a
256-token answer in blocks of 4 takes about seven lines (1200 px wide), not 64. Whitespace is visible (``·`` space,
``↵`` newline, ``→`` tab); hovering a token shows its position, id, step and confidence. A slider (and a play
button) replays the decoding: tokens not yet fixed show as masks. The plain answer text follows.

    rollout = engine.generate([messages], config=replace(config, record_states=True))   # states -> confidences
    conf = committed_confidences(rollout.states, rollout.confidences, family.mask_id)
    write_trajectory_html("trajectory.html", tokenizer, rollout.completion_ids[0], rollout.step_map[0], block=32,
                          prompt="What is 2+3?", confidences=conf)
"""

import html
import json
import re
import unicodedata

GLYPHS = {" ": "·", "\n": "↵", "\t": "→", "\r": "␍"}


def visible(text: str) -> str:
    """The token text with whitespace and control characters made visible (an empty token shows as ∅)."""
    if text == "":
        return "∅"
    out = []
    for ch in text:
        if ch in GLYPHS:
            out.append(GLYPHS[ch])
        elif ch.isspace():
            out.append("⍽")
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn"):
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def committed_confidences(states, confidences, mask_id: int, row: int = 0) -> list[float | None] | None:
    """The probability each token of ``row`` had when it was committed, from a decoding run with
    ``record_states=True``: ``states[k]`` is the canvas after step k and ``confidences[k]`` the probability of every
    proposal of step k; a token's value is read at the first step its position holds no mask. ``None`` when the
    decoding did not record confidences (masked families with a prefix/dual cache record the states only)."""
    if not states or not confidences or len(states) != len(confidences):
        return None
    import torch
    canvas = torch.stack([s[row] for s in states])  # [steps, length]
    probs = torch.stack([c[row] for c in confidences]).float()
    fixed = canvas != mask_id
    first = fixed.long().argmax(0)  # the first step at which the position is no longer a mask
    values = probs.gather(0, first[None]).squeeze(0)
    return [float(v) if bool(f) else None for v, f in zip(values, fixed.any(0), strict=True)]


def write_trajectory_html(path: str, tokenizer, token_ids, step_map, block: int | None = None,
                          title: str = "Decoding order", prompt: str | None = None, confidences=None) -> str:
    """``token_ids``/``step_map``: one generated row and the step each token was fixed (-1: not generated, left
    out); ``block``: the tokens per block (None: one block); ``confidences``: optional probability of each token at
    its commit (None entries: unknown), e.g. from ``committed_confidences``."""
    ids, steps = [int(t) for t in token_ids], [int(s) for s in step_map]
    if len(ids) != len(steps):
        raise ValueError(f"{len(ids)} tokens but {len(steps)} step entries")
    if confidences is not None:
        confidences = [None if c is None else float(c) for c in confidences]
        if len(confidences) != len(ids):
            raise ValueError(f"{len(ids)} tokens but {len(confidences)} confidences")
    cells = []
    for i, (t, s) in enumerate(zip(ids, steps, strict=True)):
        if s < 0:
            continue
        text = tokenizer.decode([t])
        cell = {"text": text, "shown": visible(text), "step": s, "id": t, "pos": i}
        if confidences is not None and confidences[i] is not None:
            cell["conf"] = round(confidences[i], 4)
        cells.append(cell)
    first = min((c["step"] for c in cells), default=0)
    last = max((c["step"] for c in cells), default=0)
    known = [c["conf"] for c in cells if "conf" in c]
    facts = [f"{len(cells)} tokens", f"steps {first}–{last} ({len({c['step'] for c in cells})} distinct)",
             f"block {block}" if block else "one block"]
    if known:
        facts.append(f"mean confidence at commit {sum(known) / len(known):.3f}")
    answer = tokenizer.decode([c["id"] for c in cells])
    values = {"TITLE": html.escape(title), "FACTS": html.escape(" · ".join(facts)),
              "PROMPT": html.escape(prompt) if prompt is not None else "<i>(not given)</i>",
              "ANSWER": html.escape(answer), "HASCONF": "" if known else " disabled",
              "CELLS": json.dumps(cells).replace("<", "\\u003c"),  # a token "</script>" cannot end the script
              "BLOCK": str(block or len(cells) or 1), "FIRST": str(first), "LAST": str(last)}
    page = re.sub(r"__([A-Z]+)__", lambda m: values[m.group(1)], _PAGE)  # one pass: no text is substituted twice
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em 2em; color: #222; }
h2 { margin: 0 0 .2em 0; } h3 { margin: 1em 0 .3em 0; font-size: 1em; }
.facts { color: #666; font-size: .9em; }
.text { white-space: pre-wrap; overflow-wrap: anywhere; font-family: ui-monospace, monospace; font-size: .9em;
        background: #f6f6f6; border-left: 3px solid #bbb; padding: .5em .8em; max-height: 12em; overflow: auto; }
.controls { display: flex; flex-wrap: wrap; gap: 1.2em; align-items: center; margin: .8em 0 .4em 0; font-size: .9em; }
.legend { display: flex; align-items: center; gap: .5em; font-size: .8em; margin: .3em 0 .6em 0; }
.legend .bar { display: flex; border: 1px solid #999; }
.legend .bar span { width: 34px; height: 16px; display: inline-block; text-align: center; line-height: 16px; }
#t { display: flex; flex-wrap: wrap; align-items: flex-start; gap: 4px 6px; }
.block { display: inline-flex; flex-wrap: wrap; max-width: 100%; border: 1px solid #bbb; border-radius: 5px;
         padding: 2px; }
.cell { margin: 1px; padding: 1px 3px; border-radius: 3px; font-family: ui-monospace, monospace; font-size: 13px;
        white-space: pre; text-align: center; min-width: 1ch; cursor: default; }
.cell small { display: block; font-size: 9px; opacity: .8; }
.glyph { opacity: .55; }
.masked { background: #e8e8e8 !important; color: #999 !important; }
</style></head><body>
<h2>__TITLE__</h2>
<div class="facts">__FACTS__</div>
<h3>Prompt</h3>
<div class="text" id="prompt">__PROMPT__</div>
<h3>Decoding order</h3>
<div class="controls">
  <label>replay up to step <input id="s" type="range" min="__FIRST__" max="__LAST__" value="__LAST__">
    <span id="v"></span></label> <button id="play">▶ play</button>
  <span>colour by <label><input type="radio" name="colour" value="step" checked> step</label>
    <label><input type="radio" name="colour" value="conf"__HASCONF__> confidence</label></span>
  <span>number under token <label><input type="radio" name="num" value="step" checked> step</label>
    <label><input type="radio" name="num" value="conf"__HASCONF__> confidence</label>
    <label><input type="radio" name="num" value="none"> none</label></span>
</div>
<div class="legend" id="legend"></div>
<div id="t"></div>
<p class="facts">Boxes are blocks. Whitespace: · space, ↵ newline, → tab, ∅ empty token. Hover a token for its
position, id, step and confidence at commit (the probability of the committed token when it was fixed; recorded with
record_states, as evaluate.py --trajectory does).</p>
<h3>Answer</h3>
<div class="text" id="answer">__ANSWER__</div>
<script>
const cells = __CELLS__, block = __BLOCK__, first = __FIRST__, last = __LAST__;
const t = document.getElementById("t"), s = document.getElementById("s"), v = document.getElementById("v");
const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
const CONF = [[215, 48, 39], [252, 141, 89], [254, 224, 139], [145, 207, 96], [26, 152, 80]];
function ramp(stops, x) {
  x = Math.min(Math.max(x, 0), 1) * (stops.length - 1);
  const i = Math.min(Math.floor(x), stops.length - 2), f = x - i;
  return stops[i].map((c, k) => Math.round(c + f * (stops[i + 1][k] - c)));
}
function colour(value, mode) {
  if (value === undefined) return [200, 200, 200];
  return mode === "conf" ? ramp(CONF, value) : ramp(VIRIDIS, last > first ? (value - first) / (last - first) : 0);
}
const ink = c => (0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]) > 150 ? "black" : "white";
const rgb = c => `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
const pick = name => document.querySelector(`input[name=${name}]:checked`).value;
function legend(mode) {
  const l = document.getElementById("legend"); l.innerHTML = "";
  const label = document.createElement("span");
  label.textContent = mode === "conf" ? "confidence at commit:" : "step fixed (early → late):"; l.appendChild(label);
  const bar = document.createElement("span"); bar.className = "bar";
  for (let k = 0; k < 8; k++) {
    const x = k / 7, value = mode === "conf" ? x : first + x * (last - first), c = colour(value, mode);
    const sw = document.createElement("span"); sw.style.background = rgb(c); sw.style.color = ink(c);
    sw.textContent = mode === "conf" ? x.toFixed(2) : Math.round(value); bar.appendChild(sw);
  }
  l.appendChild(bar);
  const m = document.createElement("span"); m.className = "cell masked"; m.textContent = "[M]"; l.appendChild(m);
  l.appendChild(document.createTextNode("not yet fixed"));
}
function draw() {
  const upto = +s.value, mode = pick("colour"), num = pick("num");
  v.textContent = upto + " / " + last; t.innerHTML = ""; legend(mode);
  for (let b = 0; b < cells.length; b += block) {
    const box = document.createElement("span"); box.className = "block";
    for (const c of cells.slice(b, b + block)) {
      const e = document.createElement("span"), value = mode === "conf" ? c.conf : c.step, col = colour(value, mode);
      const hidden = c.step > upto;
      e.className = "cell" + (hidden ? " masked" : "");
      e.style.background = rgb(col); e.style.color = ink(col);
      if (hidden) e.textContent = "[M]"; else fill(e, c);
      e.title = `position ${c.pos} · ${JSON.stringify(c.text)} (id ${c.id}) · step ${c.step}` +
                (c.conf === undefined ? "" : ` · confidence ${c.conf.toFixed(3)}`);
      if (num !== "none") {
        const n = document.createElement("small");
        n.textContent = hidden ? "\u00a0" : num === "conf" ? (c.conf === undefined ? "?" : c.conf.toFixed(2)) : c.step;
        e.appendChild(n);
      }
      box.appendChild(e);
    }
    t.appendChild(box);
  }
  const tops = new Set([...t.querySelectorAll(".cell")].map(e => Math.round(e.getBoundingClientRect().top)));
  document.body.dataset.rows = tops.size;  // lines of tokens as laid out (read by the tests)
}
function fill(e, c) {  // the token, its whitespace glyphs dimmed
  for (const ch of c.shown) {
    if (GLYPHS.includes(ch) && !c.text.includes(ch)) {
      const g = document.createElement("span"); g.className = "glyph"; g.textContent = ch; e.appendChild(g);
    } else e.appendChild(document.createTextNode(ch));
  }
}
const GLYPHS = "·↵→␍⍽∅";
for (const kv of location.hash.slice(1).split("&")) {  // e.g. page.html#colour=conf&num=none&step=12
  const [k, val] = kv.split("=");
  if (k === "step") s.value = val;
  else if (k === "colour" || k === "num") { const r = document.querySelector(`input[name=${k}][value=${val}]`);
                                            if (r && !r.disabled) r.checked = true; }
}
let timer = null;
document.getElementById("play").onclick = () => {
  if (timer) { clearInterval(timer); timer = null; return; }
  if (+s.value >= last) s.value = first;
  timer = setInterval(() => { if (+s.value >= last) { clearInterval(timer); timer = null; return; }
                              s.value = +s.value + 1; draw(); }, Math.max(40, 4000 / Math.max(last - first, 1)));
};
s.oninput = draw;
document.querySelectorAll("input[type=radio]").forEach(r => r.onchange = draw);
draw();
</script></body></html>
"""
