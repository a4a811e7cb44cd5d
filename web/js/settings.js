// The settings dialog, kept on the server through ComfyUI's /settings routes (one POST per change,
// under ComfyUI's setting ids where it has one): link style, snap to grid, preview method,
// confirm before clearing the canvas, and the keybindings (see keybindings.js).

import { el } from "./widgets.js";
import { Keybindings, comboOf } from "./keybindings.js";

export const SETTINGS = [
  { id: "Comfy.LinkRenderMode", label: "Link style", type: "combo", default: 2,
    options: [[2, "spline"], [1, "linear"], [0, "straight"], [-1, "hidden"]] },
  { id: "pysssss.SnapToGrid", label: "Snap nodes to the grid when moved", type: "boolean", default: false },
  { id: "Comfy.SnapToGrid.GridSize", label: "Grid size", type: "number", default: 20, min: 2, max: 500 },
  { id: "Comfy.Execution.PreviewMethod", label: "Preview method (live images while sampling)", type: "combo", default: "default",
    options: [["default", "server default"], ["auto", "auto"], ["latent2rgb", "latent2rgb (fast)"], ["taesd", "taesd"], ["none", "none"]] },
  { id: "Comfy.ConfirmClear", label: "Ask before clearing the canvas", type: "boolean", default: true },
];

export class Settings {
  constructor(app) {
    this.app = app;
    this.values = {};
    this.dialog = null;
  }

  async load() {
    try { this.values = (await this.app.api.fetchJson("/settings")) || {}; } catch { this.values = {}; }
    this.keys = new Keybindings(this.app, this);
    this.keys.renderHelp();
    this.apply();
  }

  get(id) {
    const spec = SETTINGS.find((s) => s.id === id);
    const v = this.values[id];
    return v === undefined || v === null ? spec?.default : v;
  }

  async set(id, value) {
    this.values[id] = value;
    this.apply();
    await this.app.api.fetchJson(`/settings/${encodeURIComponent(id)}`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(value),
    });
    this.app.emit("settingChanged", { id, value });
  }

  apply() {
    const editor = this.app.editor;
    editor.links.setStyle(this.get("Comfy.LinkRenderMode"));
    editor.snap = this.get("pysssss.SnapToGrid") ? Math.max(2, Number(this.get("Comfy.SnapToGrid.GridSize")) || 20) : 0;
    this.app.api.previewMethod = this.get("Comfy.Execution.PreviewMethod");
  }

  // --- the dialog ---------------------------------------------------------------------------------
  open() {
    this.dialog?.remove();
    const body = el("div", { class: "settings-body" });
    for (const spec of SETTINGS) body.append(this.#row(spec));
    body.append(el("h3", {}, "Keybindings"), this.#keyTable());
    const close = el("button", { type: "button", "data-action": "close-settings" }, "Close");
    this.dialog = el("div", { class: "modal settings-dialog", "data-role": "settings" },
      el("div", { class: "modal-box settings-box" }, el("div", { class: "modal-title" }, "Settings"), body, el("div", { class: "modal-actions" }, close)));
    close.addEventListener("click", () => this.close());
    this.dialog.addEventListener("keydown", (e) => { if (e.key === "Escape" && !this.dialog.querySelector(".capturing")) this.close(); });
    document.body.append(this.dialog);
    close.focus();
  }

  close() { this.dialog?.remove(); this.dialog = null; }

  #row(spec) {
    const value = this.get(spec.id);
    let control;
    if (spec.type === "boolean") {
      control = el("input", { type: "checkbox", "data-setting": spec.id });
      control.checked = !!value;
      control.addEventListener("change", () => this.set(spec.id, control.checked));
    } else if (spec.type === "number") {
      control = el("input", { type: "number", "data-setting": spec.id, min: String(spec.min), max: String(spec.max), value: String(value) });
      control.addEventListener("change", () => this.set(spec.id, Math.min(spec.max, Math.max(spec.min, Number(control.value) || spec.default))));
    } else {
      control = el("select", { "data-setting": spec.id });
      for (const [v, label] of spec.options) control.append(el("option", { value: String(v) }, label));
      control.value = String(value);
      control.addEventListener("change", () => {
        const picked = spec.options.find(([v]) => String(v) === control.value)[0];
        this.set(spec.id, picked);
      });
    }
    return el("label", { class: "settings-row" }, el("span", {}, spec.label), control);
  }

  #keyTable() {
    const table = el("table", { class: "keys-table" });
    const current = this.keys.current();
    for (const c of this.keys.list) {
      const shown = el("span", { class: "keys" }, (current.get(c.id) || []).join(", ") || "—");
      const change = el("button", { type: "button", class: "small", "data-action": "rebind" }, "change");
      const reset = el("button", { type: "button", class: "small", "data-action": "reset-binding" }, "default");
      change.addEventListener("click", () => {
        change.classList.add("capturing");
        change.textContent = "press keys…";
        const capture = async (e) => {
          if (["Control", "Shift", "Alt", "Meta"].includes(e.key)) return;
          e.preventDefault(); e.stopPropagation();
          window.removeEventListener("keydown", capture, true);
          change.classList.remove("capturing");
          change.textContent = "change";
          if (e.key !== "Escape") await this.keys.bind(c.id, comboOf(e));
          shown.textContent = (this.keys.current().get(c.id) || []).join(", ") || "—";
        };
        window.addEventListener("keydown", capture, true);
      });
      reset.addEventListener("click", async () => { await this.keys.bind(c.id, null); shown.textContent = c.keys.join(", ") || "—"; });
      table.append(el("tr", { "data-command": c.id }, el("td", {}, c.label), el("td", {}, shown), el("td", {}, change, reset)));
    }
    return table;
  }

  // --- clearing the canvas (asks first when the setting says so) ----------------------------------
  async clearCanvas() {
    if (this.get("Comfy.ConfirmClear") && !(await this.confirm("Clear the canvas? (Ctrl+Z brings it back)"))) return false;
    const editor = this.app.editor;
    editor.graph.nodes.clear();
    editor.graph.groups = [];
    editor.graph.reroutes.clear();
    editor.renderAll();
    editor.commit();
    return true;
  }

  confirm(message) {
    return new Promise((resolve) => {
      const ok = el("button", { type: "button", class: "primary", "data-action": "confirm-ok" }, "OK");
      const cancel = el("button", { type: "button", "data-action": "confirm-cancel" }, "Cancel");
      const box = el("div", { class: "modal", "data-role": "confirm" },
        el("div", { class: "modal-box" }, el("div", { class: "modal-title" }, message), el("div", { class: "modal-actions" }, cancel, ok)));
      const done = (answer) => { box.remove(); resolve(answer); };
      ok.addEventListener("click", () => done(true));
      cancel.addEventListener("click", () => done(false));
      document.body.append(box);
      ok.focus();
    });
  }
}
