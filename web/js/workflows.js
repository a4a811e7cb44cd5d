// Workflows: tabs (each with its own graph and undo history), the default workflow, save/load
// (download, open file, server-side list through /userdata), drag-and-drop of JSON and PNG files,
// API-format export, and the session kept in localStorage across reloads.

import { Graph, History } from "./graph.js";
import { isPng, readPngText, toSavedFormat, detectFormat, uiNeedsServer } from "./formats.js";
import { el } from "./widgets.js";
import { reportIfIncomplete } from "./compat.js";

const SESSION_KEY = "loom.session";
let tabCounter = 0;

export class Tabs {
  constructor(app) {
    this.app = app;
    this.list = [];
    this.current = null;
    this.bar = document.querySelector(".tab-bar");
    document.querySelector('[data-action="new-tab"]').addEventListener("click", () => this.open(null, "Untitled"));
  }

  open(saved, name) {
    const graph = new Graph(this.app.info);
    if (saved) graph.loadSaved(saved);
    const tab = { id: ++tabCounter, name, graph, history: new History(graph), view: null, dirty: false, outputs: {} };
    this.list.push(tab);
    this.activate(tab);
    return tab;
  }

  activate(tab) {
    this.current = tab;
    this.app.editor.show(tab);
    this.app.editor.emit("tabShown", { tab });
    this.render();
    this.app.persist();
  }

  close(tab) {
    const index = this.list.indexOf(tab);
    this.list.splice(index, 1);
    if (!this.list.length) { this.open(null, "Untitled"); return; }
    if (tab === this.current) this.activate(this.list[Math.max(0, index - 1)]);
    else { this.render(); this.app.persist(); }
  }

  render() {
    this.bar.textContent = "";
    for (const tab of this.list) {
      const close = el("button", { type: "button", class: "tab-close", title: "close", "data-action": "close-tab" }, "×");
      const item = el("div", { class: `tab${tab === this.current ? " active" : ""}`, "data-tab": String(tab.id), title: tab.name },
        el("span", { class: "tab-name" }, tab.name), close);
      item.addEventListener("click", () => { if (tab !== this.current) this.activate(tab); });
      close.addEventListener("click", (e) => { e.stopPropagation(); this.close(tab); });
      this.bar.append(item);
    }
  }
}

export function defaultWorkflow(info) {
  const ckpts = info.CheckpointLoaderSimple?.input?.required?.ckpt_name?.[0] || [];
  const ckpt = ckpts.find((c) => String(c).toLowerCase().includes("demo")) || ckpts[0] || "";
  const demo = String(ckpt).toLowerCase().includes("demo");
  const node = (type, inputs, title) => ({ class_type: type, inputs, _meta: { title } });
  const prompt = {
    4: node("CheckpointLoaderSimple", { ckpt_name: ckpt }, "Load Checkpoint"),
    6: node("CLIPTextEncode", { text: "a watercolor landscape, mountains at sunrise, mist over a lake", clip: ["4", 1] }, "Positive prompt"),
    7: node("CLIPTextEncode", { text: "text, watermark, blurry", clip: ["4", 1] }, "Negative prompt"),
    5: node("EmptyLatentImage", { width: demo ? 256 : 512, height: demo ? 256 : 512, batch_size: 1 }, "Empty Latent Image"),
    3: node("KSampler", { seed: 42, steps: demo ? 8 : 20, cfg: 7, sampler_name: "euler", scheduler: "normal", denoise: 1,
      model: ["4", 0], positive: ["6", 0], negative: ["7", 0], latent_image: ["5", 0] }, "KSampler"),
    8: node("VAEDecode", { samples: ["3", 0], vae: ["4", 2] }, "VAE Decode"),
    9: node("SaveImage", { images: ["8", 0], filename_prefix: "Loom" }, "Save Image"),
  };
  for (const [id, n] of Object.entries(prompt)) if (!info[n.class_type]) delete prompt[id];
  const pos = { 4: [20, 300], 6: [380, 40], 7: [380, 300], 5: [380, 540], 3: [840, 40], 8: [1260, 40], 9: [1500, 40] };
  const nodes = {};
  for (const id of Object.keys(prompt)) nodes[id] = { pos: pos[id], size: [0, 0] };
  if (nodes[6]) nodes[6].title = "Positive prompt";
  if (nodes[7]) nodes[7].title = "Negative prompt";
  return { format: "loom.workflow", version: 2, prompt, layout: { nodes, groups: [] }, extra: {} };
}

export class Workflows {
  constructor(app) {
    this.app = app;
    this.api = app.api;
    this.panel = document.querySelector('[data-panel="workflows"] .panel-body');
    const action = (name, fn) => document.querySelector(`[data-action="${name}"]`)?.addEventListener("click", fn);
    action("save", () => this.save());
    action("download", () => this.download());
    action("export-api", () => this.exportApi());
    action("open-file", () => this.fileInput.click());
    action("load-default", () => this.app.tabs.open(defaultWorkflow(this.app.info), "Default"));
    action("refresh-workflows", () => this.refreshList());
    this.fileInput = el("input", { type: "file", accept: ".json,.png,application/json,image/png", hidden: true, "data-role": "open-file" });
    document.body.append(this.fileInput);
    this.fileInput.addEventListener("change", async () => {
      if (this.fileInput.files[0]) await this.loadFile(this.fileInput.files[0]);
      this.fileInput.value = "";
    });
    const root = app.editor.root;
    root.addEventListener("dragover", (e) => { if (e.dataTransfer?.types?.includes("Files")) { e.preventDefault(); root.classList.add("drop-target"); } });
    root.addEventListener("dragleave", () => root.classList.remove("drop-target"));
    root.addEventListener("drop", (e) => {
      root.classList.remove("drop-target");
      if (!e.dataTransfer?.files?.length) return;
      e.preventDefault();
      this.loadFile(e.dataTransfer.files[0]);
    });
    window.addEventListener("keydown", (e) => {
      if ((e.ctrlKey || e.metaKey) && e.key.toLowerCase() === "s") { e.preventDefault(); this.save(); }
      if ((e.ctrlKey || e.metaKey) && e.key.toLowerCase() === "o") { e.preventDefault(); this.fileInput.click(); }
    });
  }

  // A File (JSON or PNG) → a new tab. Returns false when it carried no workflow.
  async loadFile(file) {
    const buffer = await file.arrayBuffer();
    const name = file.name.replace(/\.(json|png)$/i, "");
    try {
      if (isPng(new Uint8Array(buffer, 0, Math.min(8, buffer.byteLength)))) {
        const chunks = await readPngText(buffer);
        const candidates = [chunks.workflow, chunks.prompt].filter(Boolean);
        for (const text of candidates) {
          let obj;
          try { obj = JSON.parse(text); } catch { continue; }
          if (detectFormat(obj)) return await this.loadObject(obj, name);
        }
        this.app.editor.toast(`${file.name} carries no workflow`, "warn");
        return false;
      }
      return await this.loadObject(JSON.parse(new TextDecoder().decode(buffer)), name);
    } catch (err) {
      this.app.editor.toast(`Could not load ${file.name}: ${err.message}`, "error", 8000);
      return false;
    }
  }

  async loadObject(obj, name) {
    let saved;
    if (detectFormat(obj) === "ui" && uiNeedsServer(obj, this.app.info)) {
      const prompt = await this.api.fetchJson("/api/v1/workflows/convert", {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(obj),
      });
      saved = toSavedFormat(prompt.prompt || prompt, this.app.info);
    } else saved = toSavedFormat(obj, this.app.info);
    this.app.tabs.open(saved, name || "Loaded");
    reportIfIncomplete(this.app, obj, name); // not awaited: the workflow opens at once
    this.app.emit("workflowLoaded", { name });
    return true;
  }

  async save() {
    const tab = this.app.tabs.current;
    const name = await this.app.ask("Save workflow as", tab.savedName || tab.name);
    if (!name) return;
    const file = name.endsWith(".json") ? name : `${name}.json`;
    try {
      await this.api.saveWorkflow(file, tab.graph.toSaved());
    } catch (err) {
      this.app.editor.toast(`Could not save: ${err.message}`, "error");
      return;
    }
    tab.name = name.replace(/\.json$/, "");
    tab.savedName = tab.name;
    tab.dirty = false;
    this.app.tabs.render();
    this.app.persist();
    this.app.editor.toast(`Saved ${file}`);
    this.refreshList();
  }

  async refreshList() {
    let names = [];
    try { names = await this.api.listWorkflows(); } catch { /* server without userdata */ }
    this.panel.textContent = "";
    for (const name of names.filter((n) => n.endsWith(".json")).sort()) {
      const open = el("div", { class: "workflow-item", "data-workflow": name }, name.replace(/\.json$/, ""));
      const del = el("button", { type: "button", class: "small", title: "delete", "data-action": "delete-workflow" }, "×");
      open.append(del);
      open.addEventListener("click", () => this.openSaved(name));
      del.addEventListener("click", async (e) => {
        e.stopPropagation();
        if (await this.app.ask(`Delete ${name}? Type yes`, "") === "yes") { await this.api.deleteWorkflow(name); this.refreshList(); }
      });
      this.panel.append(open);
    }
    if (!this.panel.children.length) this.panel.append(el("div", { class: "empty" }, "No saved workflows yet (Ctrl+S)."));
  }

  async openSaved(name) {
    try {
      const obj = await this.api.loadWorkflow(name);
      const saved = toSavedFormat(obj, this.app.info);
      const tab = this.app.tabs.open(saved, name.replace(/\.json$/, ""));
      tab.savedName = tab.name;
    } catch (err) {
      this.app.editor.toast(`Could not open ${name}: ${err.message}`, "error");
    }
  }

  #downloadJson(obj, filename) {
    const url = URL.createObjectURL(new Blob([JSON.stringify(obj, null, 2)], { type: "application/json" }));
    const a = el("a", { href: url, download: filename });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }

  download() { const tab = this.app.tabs.current; this.#downloadJson(tab.graph.toSaved(), `${tab.name}.json`); }
  exportApi() { const tab = this.app.tabs.current; this.#downloadJson(tab.graph.toPrompt(), `${tab.name}.api.json`); }

  // --- the session: open tabs survive a reload ----------------------------------------------------
  sessionData() {
    const tabs = this.app.tabs;
    return { current: tabs.list.indexOf(tabs.current), tabs: tabs.list.map((t) => ({ name: t.name, savedName: t.savedName || null, saved: t.graph.toSaved() })) };
  }

  restoreSession() {
    let data = null;
    try { data = JSON.parse(localStorage.getItem(SESSION_KEY) || "null"); } catch { data = null; }
    if (!data?.tabs?.length) return false;
    for (const t of data.tabs) {
      try { const tab = this.app.tabs.open(t.saved, t.name); tab.savedName = t.savedName; } catch { /* skip a broken tab */ }
    }
    const tabs = this.app.tabs;
    if (!tabs.list.length) return false;
    tabs.activate(tabs.list[Math.min(Math.max(0, data.current), tabs.list.length - 1)]);
    return true;
  }

  persistNow() {
    try { localStorage.setItem(SESSION_KEY, JSON.stringify(this.sessionData())); } catch { /* storage full */ }
  }
}
