// Keyboard commands: every shortcut is a named command with a default key combination; the user
// may rebind any of them (Settings → Keybindings, stored in /settings under ComfyUI's
// `Comfy.Keybinding.NewBindings` id as [{commandId, combo: {key, ctrl, alt, shift}}]). A rebound
// command's default combination stops doing it. The help overlay lists the current bindings.

import { isTyping } from "./canvas.js";
import { el } from "./widgets.js";

export const BINDINGS_SETTING = "Comfy.Keybinding.NewBindings";

// combo text: "Ctrl+Shift+Z", "Alt+U", "Delete", "/"
export function comboOf(e) {
  const parts = [];
  if (e.ctrlKey || e.metaKey) parts.push("Ctrl");
  if (e.altKey) parts.push("Alt");
  if (e.shiftKey && e.key.length > 1) parts.push("Shift");
  let key = e.key === " " ? "Space" : e.key;
  if (key.length === 1) key = key.toUpperCase();
  parts.push(key);
  return parts.join("+");
}

function comboText(combo) {
  if (!combo) return "";
  const parts = [];
  if (combo.ctrl) parts.push("Ctrl");
  if (combo.alt) parts.push("Alt");
  if (combo.shift) parts.push("Shift");
  parts.push(combo.key.length === 1 ? combo.key.toUpperCase() : combo.key);
  return parts.join("+");
}

function comboFromText(text) {
  const parts = text.split("+");
  const key = parts.pop();
  return { key: key.length === 1 ? key.toLowerCase() : key, ctrl: parts.includes("Ctrl"), alt: parts.includes("Alt"), shift: parts.includes("Shift") };
}

// The commands, with what they do in `app`.
export function commands(app) {
  const ed = () => app.editor;
  const sel = () => [...ed().selection];
  const toggle = (mode) => { const ids = sel(); if (ids.length) ed().setMode(ids, ed().graph.nodes.get(ids[0]).mode === mode ? 0 : mode); };
  return [
    { id: "Comfy.QueuePrompt", label: "Queue the workflow", keys: ["Ctrl+Enter"], run: () => document.querySelector('[data-action="queue"]').click() },
    { id: "Comfy.Undo", label: "Undo", keys: ["Ctrl+Z"], run: () => ed().undo() },
    { id: "Comfy.Redo", label: "Redo", keys: ["Ctrl+Y", "Ctrl+Shift+Z"], run: () => ed().redo() },
    { id: "Loom.Copy", label: "Copy the selected nodes", keys: ["Ctrl+C"], run: () => ed().copy() },
    { id: "Loom.Paste", label: "Paste", keys: ["Ctrl+V"], run: () => ed().paste() },
    { id: "Loom.SelectAll", label: "Select all nodes", keys: ["Ctrl+A"], run: () => ed().selectAll() },
    { id: "Loom.Delete", label: "Delete the selection", keys: ["Delete", "Backspace"], run: () => { if (sel().length) ed().deleteNodes(sel()); } },
    { id: "Comfy.Canvas.ToggleSelectedNodes.Bypass", label: "Bypass the selected nodes", keys: ["Ctrl+B"], run: () => toggle(4) },
    { id: "Comfy.Canvas.ToggleSelectedNodes.Mute", label: "Mute the selected nodes", keys: ["Ctrl+M"], run: () => toggle(2) },
    { id: "Comfy.Graph.GroupSelectedNodes", label: "Group the selected nodes", keys: ["Ctrl+G"], run: () => ed().groups.addAround(sel()) },
    { id: "Loom.Search", label: "Search and add a node", keys: ["/"], run: () => { const r = ed().root.getBoundingClientRect(); ed().openSearch(r.left + r.width / 2 - 180, r.top + 80); } },
    { id: "Loom.FitView", label: "Fit the graph in view", keys: ["."], run: () => ed().fitView() },
    { id: "Comfy.SaveWorkflow", label: "Save on the server", keys: ["Ctrl+S"], run: () => app.workflows.save() },
    { id: "Comfy.OpenWorkflow", label: "Open a workflow file", keys: ["Ctrl+O"], run: () => app.workflows.fileInput.click() },
    { id: "Comfy.ClearWorkflow", label: "Clear the canvas", keys: [], run: () => app.settings.clearCanvas() },
    { id: "Comfy.ShowSettingsDialog", label: "Settings", keys: ["Ctrl+,"], own: true, run: () => app.settings.open() },
    { id: "Loom.Help", label: "Show this list", keys: ["?"], run: () => { const h = document.querySelector('[data-role="help"]'); h.hidden = !h.hidden; } },
  ];
}

export class Keybindings {
  constructor(app, settings) {
    this.app = app;
    this.settings = settings;
    this.list = commands(app);
    window.addEventListener("keydown", (e) => this.#key(e), true); // before the editor's own keys
  }

  custom() {
    const out = new Map();
    for (const b of this.settings.get(BINDINGS_SETTING) || []) if (b && b.commandId && b.combo?.key) out.set(b.commandId, comboText(b.combo));
    return out;
  }

  // command id -> the combinations that run it now
  current() {
    const custom = this.custom();
    return new Map(this.list.map((c) => [c.id, custom.has(c.id) ? [custom.get(c.id)] : c.keys]));
  }

  async bind(commandId, text) {
    const rest = (this.settings.get(BINDINGS_SETTING) || []).filter((b) => b.commandId !== commandId);
    if (text) rest.push({ commandId, combo: comboFromText(text) });
    await this.settings.set(BINDINGS_SETTING, rest);
    this.renderHelp();
  }

  #key(e) {
    if (e.defaultPrevented || ["Control", "Shift", "Alt", "Meta"].includes(e.key)) return;
    if (document.querySelector('[data-role="settings"]:not([hidden]) .capturing')) return;
    const custom = this.custom();
    const combo = comboOf(e);
    const typing = isTyping(e.target);
    const own = this.list.find((c) => c.own && !custom.has(c.id) && c.keys.includes(combo));
    if (own) { e.preventDefault(); e.stopImmediatePropagation(); own.run(); return; }
    if (!custom.size) return; // nothing rebound: the editor's own handlers do the defaults
    const bound = this.list.find((c) => custom.get(c.id) === combo);
    if (bound && (!typing || combo.startsWith("Ctrl+") || combo.startsWith("Alt+"))) {
      e.preventDefault(); e.stopImmediatePropagation();
      bound.run();
      return;
    }
    // the default combination of a rebound command no longer runs it
    const stale = this.list.find((c) => custom.has(c.id) && c.keys.includes(combo));
    if (stale && !typing) { e.preventDefault(); e.stopImmediatePropagation(); }
  }

  renderHelp() {
    const box = document.querySelector('[data-role="keybinding-help"]');
    if (!box) return;
    box.textContent = "";
    const current = this.current();
    for (const c of this.list) {
      box.append(el("tr", { "data-command": c.id }, el("td", { class: "keys" }, (current.get(c.id) || []).join(", ") || "—"), el("td", {}, c.label)));
    }
  }
}
