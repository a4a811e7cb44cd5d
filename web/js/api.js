// The server client: ComfyUI-compatible HTTP routes and the /ws event stream (JSON messages and
// binary preview frames). Events are re-dispatched on `api.events` under their ComfyUI names.

export class ApiError extends Error {
  constructor(status, body) {
    super(body?.error?.message || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

export class Api {
  constructor(base = "") {
    this.base = base;
    this.clientId = sessionStorage.getItem("loom.clientId") || crypto.randomUUID();
    sessionStorage.setItem("loom.clientId", this.clientId);
    this.events = new EventTarget();
    this.socket = null;
  }

  url(path) { return `${this.base}${path}`; }

  async fetchJson(path, options = {}) {
    const res = await fetch(this.url(path), options);
    const text = await res.text();
    let body = null;
    try { body = text ? JSON.parse(text) : null; } catch { body = { error: { message: text } }; }
    if (!res.ok) throw new ApiError(res.status, body);
    return body;
  }

  objectInfo() { return this.fetchJson("/object_info"); }

  queuePrompt(prompt, workflow) {
    return this.fetchJson("/prompt", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ prompt, client_id: this.clientId, extra_data: this.#extraData(workflow) }),
    });
  }

  // The preview method is ComfyUI's per-prompt `preview_method` (left out for the server default).
  #extraData(workflow) {
    const extra = { extra_pnginfo: { workflow } };
    if (this.previewMethod && this.previewMethod !== "default") extra.preview_method = this.previewMethod;
    return extra;
  }

  getQueue() { return this.fetchJson("/queue"); }
  deleteFromQueue(ids) {
    return this.fetchJson("/queue", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ delete: ids }) });
  }
  interrupt() { return fetch(this.url("/interrupt"), { method: "POST" }); }
  history(maxItems = 64) { return this.fetchJson(`/history?max_items=${maxItems}`); }

  viewUrl({ filename, subfolder = "", type = "output" }) {
    return this.url(`/view?filename=${encodeURIComponent(filename)}&subfolder=${encodeURIComponent(subfolder)}&type=${encodeURIComponent(type)}`);
  }

  async uploadImage(file) {
    const form = new FormData();
    form.append("image", file, file.name);
    form.append("overwrite", "true");
    return this.fetchJson("/upload/image", { method: "POST", body: form });
  }

  async listWorkflows() {
    try {
      const list = await this.fetchJson("/userdata?dir=workflows&recurse=true");
      return (list || []).map((f) => (typeof f === "string" ? f : f.path || f.name)).filter(Boolean);
    } catch (err) {
      if (err.status === 404) return [];
      throw err;
    }
  }

  loadWorkflow(name) { return this.fetchJson(`/userdata/${encodeURIComponent(`workflows/${name}`)}`); }

  saveWorkflow(name, data) {
    return this.fetchJson(`/userdata/${encodeURIComponent(`workflows/${name}`)}?overwrite=true`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(data, null, 1),
    });
  }

  deleteWorkflow(name) { return fetch(this.url(`/userdata/${encodeURIComponent(`workflows/${name}`)}`), { method: "DELETE" }); }

  async extensions() {
    try { return await this.fetchJson("/extensions"); } catch { return []; }
  }

  // The websocket reconnects on its own; `status`, `executing`, ... and `preview` (a blob URL)
  // are dispatched as CustomEvents whose detail is the message's data.
  connect() {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const socket = new WebSocket(`${proto}//${location.host}${this.base}/ws?clientId=${encodeURIComponent(this.clientId)}`);
    socket.binaryType = "arraybuffer";
    this.socket = socket;
    socket.addEventListener("open", () => this.#emit("connected", {}));
    socket.addEventListener("close", () => {
      this.#emit("disconnected", {});
      setTimeout(() => this.connect(), 1000);
    });
    socket.addEventListener("message", (event) => {
      if (typeof event.data === "string") {
        let msg;
        try { msg = JSON.parse(event.data); } catch { return; }
        if (msg.type === "status" && msg.data?.sid) this.clientId = msg.data.sid;
        this.#emit(msg.type, msg.data || {});
        return;
      }
      const view = new DataView(event.data);
      if (view.byteLength < 8) return;
      const kind = view.getUint32(0);
      if (kind !== 1) return;
      const format = view.getUint32(4) === 2 ? "image/png" : "image/jpeg";
      const url = URL.createObjectURL(new Blob([event.data.slice(8)], { type: format }));
      this.#emit("preview", { url });
    });
  }

  #emit(type, data) { this.events.dispatchEvent(new CustomEvent(type, { detail: data })); }
}
