// Node module hooks for running the editor's modules outside a browser: the URL the editor imports
// its UI-format rules from (/api/v1/workflows/ui-rules, served by engine/server) resolves to the
// file the server serves, engine/formats/ui_rules.json.
const SERVED = "/api/v1/workflows/ui-rules";
const TABLE = new URL("../../../engine/formats/ui_rules.json", import.meta.url).href;

export async function resolve(specifier, context, nextResolve) {
  if (specifier.endsWith(SERVED)) return { url: TABLE, format: "json", shortCircuit: true };
  return nextResolve(specifier, context);
}
