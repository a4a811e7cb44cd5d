// Search-to-add: a fuzzy finder over node name, display name, category and description.
// Opened by double-clicking the canvas, the "/" key, the context menu, or a link dropped on
// empty canvas (then filtered to nodes that can take or give the link's type).

import { parseSchema, typesCompatible } from "./schema.js";
import { el } from "./widgets.js";

// Subsequence match of `query` in `text`: higher is better, -1 for no match. Contiguous runs,
// word starts and an early first hit score more.
export function fuzzyScore(query, text) {
  const q = query.toLowerCase(), t = String(text || "").toLowerCase();
  if (!q) return 0;
  const direct = t.indexOf(q);
  if (direct >= 0) return 100 - Math.min(direct, 50) + (direct === 0 ? 50 : 0) + (q.length === t.length ? 50 : 0);
  let score = 0, ti = 0, run = 0;
  for (const ch of q) {
    const found = t.indexOf(ch, ti);
    if (found < 0) return -1;
    run = found === ti ? run + 1 : 0;
    score += 1 + run * 2 + (found === 0 || /[\s_/\-.]/.test(t[found - 1] || "") ? 3 : 0);
    ti = found + 1;
  }
  return score;
}

export class Search {
  constructor(editor) {
    this.editor = editor;
    this.box = el("div", { class: "search-box", hidden: true, "data-role": "search" });
    this.input = el("input", { type: "text", class: "search-input", "data-role": "search-input", placeholder: "Search nodes…", spellcheck: false });
    this.hint = el("div", { class: "search-hint" });
    this.list = el("div", { class: "search-list" });
    this.box.append(this.input, this.hint, this.list);
    document.body.append(this.box);
    this.input.addEventListener("input", () => this.#refresh());
    this.input.addEventListener("keydown", (e) => this.#key(e));
    this.box.addEventListener("pointerdown", (e) => e.stopPropagation());
    window.addEventListener("pointerdown", (e) => { if (!this.box.hidden && !this.box.contains(e.target)) this.close(); }, true);
  }

  get isOpen() { return !this.box.hidden; }

  // opts: {clientX, clientY, filter: {inputType?, outputType?}, onPick(type)}
  open(opts) {
    this.opts = opts;
    this.active = 0;
    const vw = window.innerWidth, vh = window.innerHeight;
    this.box.style.left = `${Math.min(Math.max(8, opts.clientX ?? vw / 2 - 180), vw - 380)}px`;
    this.box.style.top = `${Math.min(Math.max(8, opts.clientY ?? 120), vh - 360)}px`;
    const f = opts.filter || {};
    this.hint.textContent = f.inputType ? `nodes taking ${f.inputType}` : f.outputType ? `nodes giving ${f.outputType}` : "";
    this.hint.hidden = !this.hint.textContent;
    this.box.hidden = false;
    this.input.value = "";
    this.#refresh();
    setTimeout(() => this.input.focus(), 0);
  }

  close() { this.box.hidden = true; this.opts = null; }

  candidates() {
    const info = this.editor.info;
    const f = this.opts?.filter || {};
    const out = [];
    for (const type of Object.keys(info)) {
      const s = parseSchema(type, info);
      if (f.inputType && !s.inputs.some((i) => typesCompatible(f.inputType, i.type))) continue;
      if (f.outputType && !s.outputs.some((o) => typesCompatible(o.type, f.outputType))) continue;
      out.push(s);
    }
    return out;
  }

  #refresh() {
    const q = this.input.value.trim();
    let scored = this.candidates().map((s) => {
      if (!q) return { s, score: 0 };
      const score = Math.max(fuzzyScore(q, s.display) * 1.2, fuzzyScore(q, s.type) * 1.2,
        fuzzyScore(q, s.category) * 0.6, q.length > 2 ? fuzzyScore(q, s.description) * 0.4 : -1);
      return { s, score };
    }).filter((x) => x.score >= 0);
    scored.sort((a, b) => b.score - a.score || a.s.display.localeCompare(b.s.display));
    scored = scored.slice(0, 60);
    this.results = scored.map((x) => x.s);
    this.active = Math.min(this.active, Math.max(0, this.results.length - 1));
    this.list.textContent = "";
    this.results.forEach((s, i) => {
      const item = el("div", { class: `search-item${i === this.active ? " active" : ""}`, "data-type": s.type },
        el("span", { class: "search-name" }, s.display),
        el("span", { class: "search-cat" }, s.category + (s.display !== s.type ? ` · ${s.type}` : "")));
      item.addEventListener("click", () => this.#pick(s.type));
      this.list.append(item);
    });
  }

  #key(e) {
    e.stopPropagation();
    if (e.key === "Escape") this.close();
    else if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      e.preventDefault();
      const n = this.results.length;
      if (!n) return;
      this.active = (this.active + (e.key === "ArrowDown" ? 1 : n - 1)) % n;
      this.list.querySelectorAll(".search-item").forEach((item, i) => item.classList.toggle("active", i === this.active));
      this.list.children[this.active]?.scrollIntoView({ block: "nearest" });
    } else if (e.key === "Enter") {
      e.preventDefault();
      if (this.results[this.active]) this.#pick(this.results[this.active].type);
    }
  }

  #pick(type) {
    const opts = this.opts;
    this.close();
    opts?.onPick(type);
  }
}
