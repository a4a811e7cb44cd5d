// Model presets in the editor. When a loader's checkpoint or diffusion model is chosen (its combo,
// or a file dragged from the model library), the server's detected family and preset
// (/api/v1/models/{folder}/{name}) are offered in a toast; "Apply" writes the preset into this
// tab's sampler, guidance and size widgets. Which widget takes which field comes from the server
// (/api/v1/presets: the table `main.py run --preset` uses), and linked inputs are left alone.

import { el } from "./widgets.js";

const OFFER_MS = 15000;

// Write `preset` into the widgets of `graph` that the server's `inputs` map names; returns the
// number of values changed.
export function applyPreset(graph, preset, inputs) {
  let changed = 0;
  for (const node of graph.nodes.values()) {
    for (const [input, field] of Object.entries(inputs[node.type] || {})) {
      const value = preset[field];
      if (value === null || value === undefined || node.links[input] || !(input in node.values)) continue;
      if (node.values[input] !== value) { node.values[input] = value; changed++; }
    }
  }
  return changed;
}

export function presetSummary(body) {
  const p = body.preset;
  const guidance = p.guidance !== null && p.guidance !== undefined ? `, guidance ${p.guidance}` : "";
  const negative = p.negative === false ? ", no negative prompt" : "";
  return `${body.family_title}: ${p.title}: ${p.steps} steps, cfg ${p.cfg}, ${p.sampler_name} / ${p.scheduler}, ` +
    `${p.width}×${p.height}${guidance}${negative}`;
}

export class PresetOffers {
  constructor(app) {
    this.app = app;
    this.table = null;
    app.editor.events.addEventListener("widgetChanged", (e) => this.#changed(e.detail));
  }

  async #tableOnce() {
    if (!this.table) this.table = this.app.api.fetchJson("/api/v1/presets").catch(() => ({ presets: [], inputs: {}, loaders: {} }));
    return this.table;
  }

  async #changed({ node, name, value }) {
    const where = (await this.#tableOnce()).loaders[node.type];
    if (where && where[1] === name && typeof value === "string" && value) await this.offer(where[0], value);
  }

  // Ask the server about `name` in model folder `folder`; offer its preset if it has one.
  async offer(folder, name) {
    const path = String(name).split("/").map(encodeURIComponent).join("/");
    let body;
    try { body = await this.app.api.fetchJson(`/api/v1/models/${encodeURIComponent(folder)}/${path}`); } catch { return; }
    if (!body?.preset) return;
    const { inputs } = await this.#tableOnce();
    const editor = this.app.editor;
    const apply = el("button", { "data-role": "apply-preset", class: "toast-action" }, "Apply");
    const item = el("div", { class: "toast info preset-offer", "data-role": "preset-offer", "data-preset": body.preset.name },
      el("span", {}, presetSummary(body)), apply);
    apply.addEventListener("click", () => {
      const changed = applyPreset(editor.graph, body.preset, inputs);
      item.remove();
      if (changed) { editor.renderAll(); editor.commit(); }
      editor.toast(`Preset ${body.preset.title}: ${changed} value${changed === 1 ? "" : "s"} set`);
    });
    for (const old of editor.toasts.querySelectorAll('[data-role="preset-offer"]')) old.remove();
    editor.toasts.append(item);
    setTimeout(() => item.remove(), OFFER_MS);
  }
}
