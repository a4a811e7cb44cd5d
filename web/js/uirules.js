// The rules of ComfyUI's UI workflow format that the editor shares with the server: one table,
// engine/formats/ui_rules.json, which the server serves at /api/v1/workflows/ui-rules and its
// converter (engine/formats/) reads too. Nothing here spells a rule out. The widget reader below
// takes the same steps as engine/formats/widgets.py `widgets_of` + `assign`;
// tests/compat/test_ui_rules.py runs both on the same cases and fails if they disagree.

import RULES from "../api/v1/workflows/ui-rules" with { type: "json" };

const CONTROL = RULES.control_after_generate;
const CONTROL_VALUES = new Set([...CONTROL.choices, ...CONTROL.also_read]);
const SEED_NAMES = new Set(CONTROL.implied_for_int_inputs);

export const FRONTEND_ONLY = new Set(RULES.frontend_only_types); // never sent to the server
export const NOTE_TYPES = new Set(RULES.note_types);
export const WIDGET_TYPES = new Set(RULES.widget_types);
export const SUBGRAPH_INPUT_NODE = RULES.subgraph_input_node, SUBGRAPH_OUTPUT_NODE = RULES.subgraph_output_node;
export const CONTROL_CHOICES = Object.freeze([...CONTROL.choices]); // what the editor offers
export const NEW_CONTROL = CONTROL.new_widget; // a new "control after generate" widget's value

export function isGroupNodeType(type) { return RULES.group_node_prefixes.some((prefix) => type.startsWith(prefix)); }

// What files store after a widget with "control after generate": a control string, a boolean
// (2023 files) or null.
export function looksLikeControl(value) { return value === null || typeof value === "boolean" || CONTROL_VALUES.has(value); }

// A parsed schema's widgets in the order files store their values: {name, controlSlots, serialize}.
// controlSlots: the values stored after it (a COMBO also stores its filter text); the upload button
// that a media-upload input brings comes last, stored but never sent (serialize false).
export function widgetsOf(schema) {
  const widgets = [];
  let upload = false;
  for (const input of schema ? schema.inputs : []) {
    if (!input.widget) continue;
    upload ||= RULES.upload.flags.some((flag) => input.opts[flag]);
    const controlled = input.opts.control_after_generate || (input.type === "INT" && SEED_NAMES.has(input.name));
    const kind = input.choices ? "COMBO" : input.type;
    widgets.push({ name: input.name, controlSlots: controlled ? CONTROL.values_stored[kind] ?? CONTROL.values_stored.other : 0, serialize: true });
  }
  if (upload) widgets.push({ name: RULES.upload.widget, controlSlots: 0, serialize: false });
  return widgets;
}

// The value the upload button stores, when a schema has one (see widgetsOf).
export function uploadValue(widgets) { return widgets.some((w) => !w.serialize) ? RULES.upload.value : undefined; }

// widgets_values → {values: {name: value}, control: {name: how}}: positionally from a list (a
// control value only where it looks like one and the file has values to spare for the widgets
// after it; surplus trailing values ignored), or by name from an object (newer files).
export function readWidgets(widgets, stored) {
  const values = {}, control = {};
  if (stored && typeof stored === "object" && !Array.isArray(stored)) {
    for (const w of widgets) if (w.serialize && w.name in stored) values[w.name] = stored[w.name];
    return { values, control };
  }
  if (!Array.isArray(stored)) return { values, control };
  let i = 0;
  for (const [position, w] of widgets.entries()) {
    if (i >= stored.length) break;
    if (w.serialize) values[w.name] = stored[i];
    i++;
    const neededAfter = widgets.length - position - 1; // values the later widgets still need
    if (w.controlSlots && i < stored.length && stored.length - i > neededAfter && looksLikeControl(stored[i])) {
      if (CONTROL.choices.includes(stored[i])) control[w.name] = stored[i];
      i++;
      if (w.controlSlots === 2 && i < stored.length && stored.length - i > neededAfter && typeof stored[i] === "string") i++;
    }
  }
  return { values, control };
}
