// Loom's editor, started: fetch the node catalogue, build the editor, restore the open tabs (or
// put the default workflow on the canvas), connect the websocket and load web extensions.
// `window.loom` is the app object (handy in the console and for tests).

import { Api } from "./api.js";
import { Editor } from "./editor.js";
import { Tabs, Workflows, defaultWorkflow } from "./workflows.js";
import { Runner } from "./queue.js";
import { Gallery } from "./gallery.js";
import { loadExtensions, registerShimWidgetTypes } from "./extensions.js";
import { el } from "./widgets.js";
import { clearSchemaCache } from "./schema.js";
import { addFrontendNodes } from "./frontend.js";
import { Settings } from "./settings.js";
import { Viewer } from "./viewer.js";
import { RunProgress } from "./progress.js";
import { Library } from "./library.js";
import { PresetOffers } from "./presets.js";
import { MaskEditor } from "./maskeditor.js";
import { SubgraphUi } from "./subgraphui.js";

class App {
  constructor() {
    this.api = new Api(location.pathname.replace(/\/(index\.html)?$/, "").replace(/\/$/, ""));
    this.events = new EventTarget();
  }

  emit(name, detail = {}) { this.events.dispatchEvent(new CustomEvent(name, { detail })); }

  async start() {
    this.info = addFrontendNodes(await this.api.objectInfo());
    this.editor = new Editor(document.querySelector(".canvas"), { info: this.info, api: this.api });
    this.editor.events.addEventListener("graphChanged", () => { this.persist(); this.emit("graphChanged", { graph: this.tabs.current.graph }); });
    this.tabs = new Tabs(this);
    this.workflows = new Workflows(this);
    this.gallery = new Gallery(this);
    this.runner = new Runner(this);
    this.viewer = new Viewer(this);
    this.progress = new RunProgress(this);
    this.library = new Library(this);
    this.presets = new PresetOffers(this);
    this.maskEditor = new MaskEditor(this);
    this.editor.subgraphUi = new SubgraphUi(this);
    this.editor.events.addEventListener("openMaskEditor", (e) => this.maskEditor.openForNode(e.detail.nodeId));
    this.settings = new Settings(this);
    await this.settings.load();
    document.querySelector('[data-action="settings"]').addEventListener("click", () => this.settings.open());
    this.#panels();
    document.querySelector('[data-action="refresh-models"]').addEventListener("click", () => this.refreshModels());
    document.querySelector('[data-action="fit"]').addEventListener("click", () => this.editor.fitView());
    const help = document.querySelector('[data-role="help"]');
    document.querySelector('[data-action="help"]').addEventListener("click", () => { help.hidden = false; });
    help.addEventListener("click", () => { help.hidden = true; });
    window.addEventListener("keydown", (e) => {
      if (e.key === "Escape") help.hidden = true;
      if (e.key === "?" && !/INPUT|TEXTAREA|SELECT/.test(e.target.tagName)) help.hidden = !help.hidden;
    });
    const hint = document.querySelector('[data-role="empty-hint"]');
    const showHint = () => { hint.hidden = this.tabs.current.graph.nodes.size > 0; };
    this.editor.events.addEventListener("graphChanged", showHint);
    this.editor.events.addEventListener("tabShown", showHint);
    if (!this.workflows.restoreSession()) this.tabs.open(defaultWorkflow(this.info), "Default");
    this.api.connect();
    this.gallery.loadHistory();
    this.runner.refreshPanel();
    this.extensions = await loadExtensions(this);
    if (this.extensions.length) { clearSchemaCache(); this.editor.renderAll(); }
    document.body.dataset.ready = "true";
    this.emit("ready", {});
  }

  persist() {
    clearTimeout(this.persistTimer);
    this.persistTimer = setTimeout(() => this.workflows.persistNow(), 200);
  }

  // Re-read /object_info (new model files appear in the combos) and redraw.
  async refreshModels() {
    const info = await this.api.objectInfo();
    for (const key of Object.keys(this.info)) delete this.info[key];
    Object.assign(this.info, addFrontendNodes(info));
    clearSchemaCache();
    this.editor.renderAll();
    this.editor.toast("Node list and model lists refreshed");
  }

  registerCustomWidgetTypes(types) { registerShimWidgetTypes(types); clearSchemaCache(); }

  addMainMenuItem(item) {
    const button = el("button", { type: "button", class: "ext-item" }, item.label);
    button.addEventListener("click", () => item.action({ editor: this.editor }));
    document.querySelector(".menu-extra").append(button);
  }

  ask(title, value = "") {
    const modal = document.querySelector(".modal");
    const input = modal.querySelector('[data-role="modal-input"]');
    modal.querySelector(".modal-title").textContent = title;
    input.value = value;
    modal.hidden = false;
    input.focus(); input.select();
    return new Promise((resolve) => {
      const finish = (result) => {
        modal.hidden = true;
        ok.removeEventListener("click", onOk); cancel.removeEventListener("click", onCancel); input.removeEventListener("keydown", onKey);
        resolve(result);
      };
      const ok = modal.querySelector('[data-action="modal-ok"]'), cancel = modal.querySelector('[data-action="modal-cancel"]');
      const onOk = () => finish(input.value.trim() || null), onCancel = () => finish(null);
      const onKey = (e) => { e.stopPropagation(); if (e.key === "Enter") onOk(); if (e.key === "Escape") onCancel(); };
      ok.addEventListener("click", onOk); cancel.addEventListener("click", onCancel); input.addEventListener("keydown", onKey);
    });
  }

  #panels() {
    for (const button of document.querySelectorAll("[data-show-panel]")) {
      button.addEventListener("click", () => {
        const name = button.dataset.showPanel;
        const panel = document.querySelector(`[data-panel="${name}"]`);
        const open = panel.hidden;
        for (const p of document.querySelectorAll(".side-panel")) p.hidden = true;
        for (const b of document.querySelectorAll("[data-show-panel]")) b.classList.remove("active");
        panel.hidden = !open;
        button.classList.toggle("active", open);
        if (open && name === "workflows") this.workflows.refreshList();
        if (open && name === "queue") this.runner.refreshPanel();
        if (open && name === "nodes") this.library.renderNodes();
        if (open && name === "models") this.library.renderModels();
        if (open && name === "templates") this.library.renderTemplates();
      });
    }
  }
}

const app = new App();
window.loom = app;
app.start().catch((err) => {
  console.error("Loom failed to start:", err);
  document.body.append(el("div", { class: "fatal" }, `Loom could not start: ${err.message}`));
});
