// Overall progress of the running prompt in the window title ("[42%] Loom"), as ComfyUI shows it:
// nodes finished (cached ones count as finished) plus the running node's own step progress, over
// the prompt's node count. Per-node progress bars are drawn by queue.js.

const TITLE = "Loom";

export class RunProgress {
  constructor(app) {
    this.sizes = new Map(); // prompt_id -> node count
    this.run = null; // {promptId, total, done, node, fraction}
    app.events.addEventListener("queued", (e) => {
      const size = Object.keys(e.detail.prompt || {}).length;
      this.sizes.set(e.detail.promptId, size);
      if (this.run && this.run.promptId === e.detail.promptId) this.run.total = size; // the run began before the answer came
    });
    const on = (type, fn) => app.api.events.addEventListener(type, (e) => fn(e.detail));
    on("execution_start", (d) => { this.run = { promptId: d.prompt_id, total: this.sizes.get(d.prompt_id) || 1, done: 0, node: null, fraction: 0 }; this.#show(); });
    on("execution_cached", (d) => { if (this.#mine(d)) { this.run.done += (d.nodes || []).length; this.#show(); } });
    on("executing", (d) => {
      if (!this.#mine(d)) return;
      if (this.run.node !== null) this.run.done += 1;
      this.run.node = d.node ?? null;
      this.run.fraction = 0;
      if (d.node === null || d.node === undefined) this.#end(); else this.#show();
    });
    on("progress", (d) => { if (this.#mine(d) && d.max) { this.run.fraction = d.value / d.max; this.#show(); } });
    for (const type of ["execution_success", "execution_error", "execution_interrupted"]) on(type, (d) => { if (this.#mine(d)) this.#end(); });
  }

  #mine(d) { return this.run && (!d.prompt_id || d.prompt_id === this.run.promptId); }

  percent() {
    if (!this.run) return null;
    return Math.min(100, Math.round(((this.run.done + this.run.fraction) / Math.max(1, this.run.total)) * 100));
  }

  #show() { document.title = `[${this.percent()}%] ${TITLE}`; }

  #end() { this.sizes.delete(this.run?.promptId); this.run = null; document.title = TITLE; }
}
