// Running workflows: the Queue button (and Ctrl+Enter) with a batch count, validation errors on
// the offending nodes and widgets, the queue panel (running, pending, cancel), and the live run
// state from the websocket (executing highlight, progress bars, previews, outputs, errors).

import { ApiError } from "./api.js";
import { el } from "./widgets.js";

export class Runner {
  constructor(app) {
    this.app = app;
    this.editor = app.editor;
    this.api = app.api;
    this.promptTabs = new Map(); // prompt_id -> tab
    this.executing = null; // {promptId, node}
    this.panel = document.querySelector('[data-panel="queue"] .panel-body');
    this.counter = document.querySelector('[data-role="queue-size"]');
    const button = document.querySelector('[data-action="queue"]');
    this.batch = document.querySelector('[data-role="batch"]');
    button.addEventListener("click", () => this.queue());
    window.addEventListener("keydown", (e) => {
      if ((e.ctrlKey || e.metaKey) && e.key === "Enter") { e.preventDefault(); this.queue(); }
    });
    document.querySelector('[data-action="interrupt"]').addEventListener("click", () => this.api.interrupt());
    const on = (type, fn) => this.api.events.addEventListener(type, (e) => fn(e.detail));
    on("status", (d) => { this.#setCount(d.status?.exec_info?.queue_remaining); this.refreshPanel(); });
    on("execution_start", (d) => { this.#forTab(d.prompt_id, () => this.editor.views.clearAllErrors()); this.refreshPanel(); });
    on("execution_cached", (d) => this.#forTab(d.prompt_id, () => { for (const id of d.nodes || []) this.editor.views.setState(String(id), "cached", true); }));
    on("executing", (d) => this.#executing(d));
    on("progress", (d) => this.#forTab(d.prompt_id, () => this.editor.views.setProgress(String(d.node ?? this.executing?.node), d.max ? d.value / d.max : null)));
    on("executed", (d) => this.#executed(d));
    on("preview", (d) => this.#preview(d.url));
    on("execution_error", (d) => this.#error(d));
    on("execution_interrupted", (d) => { this.#clearRunState(); this.editor.toast("Interrupted", "warn"); this.refreshPanel(); });
    on("execution_success", () => { this.#clearRunState(); this.refreshPanel(); });
    this.editor.events.addEventListener("tabShown", () => this.#restoreOutputs());
  }

  #setCount(n) { if (n !== undefined && this.counter) this.counter.textContent = String(n); }

  #forTab(promptId, fn) {
    const tab = this.promptTabs.get(promptId);
    if (!promptId || !tab || tab === this.app.tabs.current) fn();
  }

  async queue(count = null) {
    const editor = this.editor;
    const batch = Math.max(1, Math.min(100, count ?? (parseInt(this.batch.value, 10) || 1)));
    editor.views.clearAllErrors();
    const tab = this.app.tabs.current;
    for (let i = 0; i < batch; i++) {
      const prompt = tab.graph.toPrompt();
      const workflow = tab.graph.toSaved();
      let res;
      try {
        res = await this.api.queuePrompt(prompt, workflow);
      } catch (err) {
        if (err instanceof ApiError && err.body) this.showValidation(err.body);
        else editor.toast(`Could not queue: ${err.message}`, "error");
        break;
      }
      this.promptTabs.set(res.prompt_id, tab);
      this.app.emit("queued", { promptId: res.prompt_id, number: res.number, prompt });
      if (res.node_errors && Object.keys(res.node_errors).length) this.showValidation({ node_errors: res.node_errors });
      if (tab.graph.applyControlAfterGenerate()) {
        for (const node of tab.graph.nodes.values()) for (const name of Object.keys(node.control)) editor.views.updateWidget(node.id, name);
        editor.commit();
      }
    }
    this.refreshPanel();
  }

  // The 400 body of POST /prompt: {error: {message, details}, node_errors: {id: {errors, class_type}}}
  showValidation(body) {
    const { views } = this.editor;
    const nodeErrors = body.node_errors || {};
    let first = null;
    for (const [id, entry] of Object.entries(nodeErrors)) {
      for (const err of entry.errors || []) {
        const text = err.details ? `${err.message}: ${err.details}` : err.message;
        views.showError(String(id), text, err.extra_info?.input_name || null);
        first = first || text;
      }
    }
    const message = body.error?.message || "The workflow is invalid";
    this.editor.toast(first ? `${message} — ${first}` : `${message}${body.error?.details ? `: ${body.error.details}` : ""}`, "error", 8000);
  }

  #executing(d) {
    const views = this.editor.views;
    this.#forTab(d.prompt_id, () => {
      if (this.executing) { views.setState(this.executing.node, "executing", false); views.setProgress(this.executing.node, null); }
      if (d.node === null || d.node === undefined) { this.executing = null; return; }
      this.executing = { promptId: d.prompt_id, node: String(d.node) };
      views.setState(String(d.node), "executing", true);
    });
    if (d.node === null) this.refreshPanel();
  }

  #executed(d) {
    const tab = this.promptTabs.get(d.prompt_id) || this.app.tabs.current;
    const images = d.output?.images || [];
    const urls = images.map((img) => this.api.viewUrl(img));
    tab.outputs = tab.outputs || {};
    if (urls.length) tab.outputs[String(d.node)] = { urls };
    else if (d.output?.text) tab.outputs[String(d.node)] = { text: d.output.text };
    this.#forTab(d.prompt_id, () => {
      if (urls.length) this.editor.views.showImages(String(d.node), urls);
      else if (d.output?.text) this.editor.views.showText(String(d.node), d.output.text);
    });
    for (const img of images) this.app.gallery.add(img, d.prompt_id, String(d.node));
    this.app.emit("executed", d);
  }

  #restoreOutputs() {
    const outputs = this.app.tabs.current.outputs || {};
    for (const [id, out] of Object.entries(outputs)) {
      if (out.urls) this.editor.views.showImages(id, out.urls);
      else if (out.text) this.editor.views.showText(id, out.text);
    }
  }

  #preview(url) {
    if (!this.executing || this.api.previewMethod === "none") { URL.revokeObjectURL(url); return; }
    if (this.lastPreview) URL.revokeObjectURL(this.lastPreview);
    this.lastPreview = url;
    this.#forTab(this.executing.promptId, () => this.editor.views.showImages(this.executing.node, [url], { preview: true }));
  }

  #error(d) {
    this.#forTab(d.prompt_id, () => {
      const id = String(d.node_id);
      this.editor.views.setState(id, "exec-error", true);
      this.editor.views.showError(id, `${d.exception_type ? `${d.exception_type}: ` : ""}${d.exception_message}`);
    });
    this.editor.toast(`Error in ${d.node_type || "node"} ${d.node_id}: ${d.exception_message}`, "error", 10000);
    this.#clearRunState(false);
    this.refreshPanel();
  }

  #clearRunState() {
    const views = this.editor.views;
    if (this.executing) { views.setState(this.executing.node, "executing", false); views.setProgress(this.executing.node, null); }
    this.executing = null;
    for (const elem of views.els.values()) elem.classList.remove("cached");
  }

  async refreshPanel() {
    let q;
    try { q = await this.api.getQueue(); } catch { return; }
    const running = q.queue_running || [], pending = q.queue_pending || [];
    this.#setCount(running.length + pending.length);
    this.panel.textContent = "";
    const row = (item, state) => {
      const [number, id] = item;
      const cancel = el("button", { type: "button", class: "small", "data-action": "cancel", "data-prompt-id": id }, state === "running" ? "stop" : "cancel");
      cancel.addEventListener("click", async () => {
        if (state === "running") await this.api.interrupt();
        else await this.api.deleteFromQueue([id]);
        this.refreshPanel();
      });
      return el("div", { class: `queue-item ${state}`, "data-prompt-id": id }, el("span", {}, `#${number}`), el("span", { class: "queue-state" }, state), cancel);
    };
    for (const item of running) this.panel.append(row(item, "running"));
    for (const item of pending) this.panel.append(row(item, "pending"));
    if (!running.length && !pending.length) this.panel.append(el("div", { class: "empty" }, "Nothing queued."));
  }
}
