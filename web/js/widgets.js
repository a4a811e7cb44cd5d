// Widgets: the form controls a node shows for its INT / FLOAT / STRING / BOOLEAN / COMBO inputs,
// the seed's "control after generate", image upload with a thumbnail, and extension widgets.
// Every control carries data-widget="<input name>".

import { CONTROL_CHOICES, NEW_CONTROL } from "./uirules.js";

const factories = new Map(); // widget type -> (env) => HTMLElement, from extensions

export function registerWidget(type, factory) { factories.set(type, factory); }

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k in node && typeof v !== "string") node[k] = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);
  return node;
}
export { el };

// env: {input, value, set(value, commit), control, setControl(how), api, onImage(name)}
export function buildWidget(env) {
  const { input } = env;
  const custom = factories.get(input.type);
  if (custom) return custom(env);
  switch (input.widget) {
    case "INT": case "FLOAT": return numberWidget(env);
    case "BOOLEAN": return toggleWidget(env);
    case "COMBO": return comboWidget(env);
    case "IMAGEUPLOAD": return uploadWidget(env);
    default: return textWidget(env);
  }
}

function precision(step) {
  const text = String(step);
  return text.includes(".") ? text.split(".")[1].length : 0;
}

export function clampNumber(input, value) {
  const { opts } = input;
  let v = Number(value);
  if (!Number.isFinite(v)) v = Number(opts.default ?? 0);
  if (opts.min !== undefined) v = Math.max(opts.min, v);
  if (opts.max !== undefined) v = Math.min(opts.max, v);
  if (input.widget === "INT") return Math.round(v);
  const round = opts.round || opts.step || 0.01;
  return Number((Math.round(v / round) * round).toFixed(Math.max(precision(round), 2)));
}

function numberWidget(env) {
  const { input } = env;
  const isInt = input.widget === "INT";
  const step = input.opts.step ?? (isInt ? 1 : 0.01);
  const box = el("input", { type: "number", "data-widget": input.name, step: String(step), class: "w-number" });
  if (input.opts.min !== undefined && Math.abs(input.opts.min) < 1e15) box.min = String(input.opts.min);
  if (input.opts.max !== undefined && Math.abs(input.opts.max) < 1e15) box.max = String(input.opts.max);
  box.value = String(env.value);
  box.addEventListener("change", () => {
    const v = clampNumber(input, box.value);
    box.value = String(v);
    env.set(v, true);
  });
  // Drag the label left/right to scrub the value.
  const scrub = el("span", { class: "w-scrub", title: "drag to change" }, "⇔");
  scrub.addEventListener("pointerdown", (e) => {
    e.preventDefault(); e.stopPropagation();
    const start = Number(box.value) || 0, x0 = e.clientX;
    let moved = false;
    const move = (ev) => {
      const steps = Math.round((ev.clientX - x0) / 4);
      if (steps) moved = true;
      const v = clampNumber(input, start + steps * step);
      box.value = String(v);
      env.set(v, false);
    };
    const up = () => {
      window.removeEventListener("pointermove", move);
      window.removeEventListener("pointerup", up);
      if (moved) env.set(Number(box.value), true);
    };
    window.addEventListener("pointermove", move);
    window.addEventListener("pointerup", up);
  });
  const wrap = el("span", { class: "w-numwrap" }, box, scrub);
  if (input.opts.control_after_generate) {
    const control = el("select", { "data-widget-control": input.name, class: "w-control", title: "control after generate" });
    for (const how of CONTROL_CHOICES) control.append(el("option", { value: how }, how));
    control.value = env.control || NEW_CONTROL;
    control.addEventListener("change", () => env.setControl(control.value));
    wrap.append(control);
  }
  env.update = (v) => { box.value = String(v); };
  return wrap;
}

function toggleWidget(env) {
  const box = el("input", { type: "checkbox", "data-widget": env.input.name, class: "w-toggle" });
  box.checked = !!env.value;
  box.addEventListener("change", () => env.set(box.checked, true));
  env.update = (v) => { box.checked = !!v; };
  return box;
}

function fillChoices(select, choices, value) {
  select.textContent = "";
  const list = [...(choices || [])];
  for (const choice of list) select.append(el("option", { value: String(choice) }, String(choice)));
  if (value !== undefined && value !== null && !list.map(String).includes(String(value))) {
    select.append(el("option", { value: String(value), class: "missing" }, `${value} (missing)`));
  }
  select.value = String(value ?? "");
}

function comboWidget(env) {
  const select = el("select", { "data-widget": env.input.name, class: "w-combo" });
  fillChoices(select, env.input.choices, env.value);
  select.addEventListener("change", () => env.set(select.value, true));
  env.update = (v) => fillChoices(select, env.input.choices, v);
  return select;
}

function textWidget(env) {
  const multiline = !!env.input.opts.multiline;
  const box = multiline
    ? el("textarea", { "data-widget": env.input.name, class: "w-text", rows: "4", spellcheck: false })
    : el("input", { type: "text", "data-widget": env.input.name, class: "w-text" });
  box.value = String(env.value ?? "");
  if (env.input.opts.placeholder) box.placeholder = env.input.opts.placeholder;
  box.addEventListener("input", () => env.set(box.value, false));
  box.addEventListener("change", () => env.set(box.value, true));
  env.update = (v) => { box.value = String(v ?? ""); };
  return box;
}

function uploadWidget(env) {
  const select = comboWidget(env);
  const thumb = el("img", { class: "w-thumb", alt: "" });
  const file = el("input", { type: "file", accept: "image/*", hidden: true, "data-upload": env.input.name });
  const button = el("button", { type: "button", class: "w-upload", "data-action": "upload" }, "upload…");
  const showThumb = (name) => {
    thumb.hidden = !name;
    if (name) thumb.src = `view?filename=${encodeURIComponent(name)}&type=input&subfolder=`;
  };
  thumb.addEventListener("error", () => { thumb.hidden = true; });
  select.addEventListener("change", () => showThumb(select.value));
  button.addEventListener("click", () => file.click());
  file.addEventListener("change", async () => {
    if (!file.files.length) return;
    const result = await env.api.uploadImage(file.files[0]);
    const name = result.subfolder ? `${result.subfolder}/${result.name}` : result.name;
    if (!env.input.choices.includes(name)) env.input.choices.push(name);
    fillChoices(select, env.input.choices, name);
    env.set(name, true);
    showThumb(name);
  });
  const prev = env.update;
  env.update = (v) => { prev(v); showThumb(v); };
  showThumb(env.value);
  return el("div", { class: "w-upload-box" }, el("div", { class: "w-upload-row" }, select, button), thumb, file);
}
