import { test } from "node:test";
import assert from "node:assert/strict";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import ts from "typescript";

import { startNode } from "./helpers.mjs";

const src = join(dirname(fileURLToPath(import.meta.url)), "..", "src", "wire.ts");

/** The JSON types a schema allows: "string", "integer", "null", ... */
function kinds(doc, schema) {
  if (schema.$ref) return kinds(doc, doc.components.schemas[schema.$ref.split("/").pop()]);
  const alternatives = schema.oneOf ?? schema.anyOf;
  if (alternatives) return new Set(alternatives.flatMap((s) => [...kinds(doc, s)]));
  const type = schema.type ?? (schema.properties ? "object" : undefined);
  const list = Array.isArray(type) ? type : [type];
  // An integer is a JSON number.
  return new Set(list.map((t) => (t === "integer" ? "number" : t)));
}

/** The JSON types a TypeScript type allows. */
function tsKinds(checker, type) {
  const out = new Set();
  for (const t of type.isUnion() ? type.types : [type]) {
    const f = t.flags;
    if (f & (ts.TypeFlags.String | ts.TypeFlags.StringLiteral)) out.add("string");
    else if (f & (ts.TypeFlags.Number | ts.TypeFlags.NumberLiteral)) out.add("number");
    else if (f & (ts.TypeFlags.Boolean | ts.TypeFlags.BooleanLiteral)) out.add("boolean");
    else if (f & ts.TypeFlags.Null) out.add("null");
    else if (f & ts.TypeFlags.Undefined) continue;
    else if (checker.isArrayType(t)) out.add("array");
    else if (f & ts.TypeFlags.Object) out.add("object");
    else out.add(checker.typeToString(t));
  }
  return out;
}

// The wire types the client reads (src/wire.ts) against the OpenAPI
// document the node serves: each field is in its schema with the same JSON
// type, a field the client cannot do without is one the schema requires,
// and each field the schema requires is one the client knows.
test("the client's wire types agree with the OpenAPI document", async (t) => {
  const n = await startNode(t);
  const doc = await (await fetch(n.url + "/openapi.json")).json();
  const schemas = {
    ...doc.components.schemas,
    Renewed: doc.paths["/v1/leases/{id}/keepalive"].post.responses["200"].content["application/json"].schema,
  };
  const program = ts.createProgram([src], { strict: true });
  const checker = program.getTypeChecker();
  const file = program.getSourceFile(src);
  const interfaces = file.statements.filter(ts.isInterfaceDeclaration);
  assert.ok(interfaces.length >= 7, "wire.ts declares the wire types");
  const problems = [];
  for (const decl of interfaces) {
    const name = decl.name.text;
    const schema = schemas[name];
    if (!schema) {
      problems.push(`${name}: no such schema`);
      continue;
    }
    const type = checker.getTypeAtLocation(decl);
    const fields = new Set();
    for (const prop of checker.getPropertiesOfType(type)) {
      const field = prop.getName();
      fields.add(field);
      const theirs = schema.properties?.[field];
      if (!theirs) {
        problems.push(`${name}.${field}: not in the schema`);
        continue;
      }
      const optional = (prop.flags & ts.SymbolFlags.Optional) !== 0;
      if (!optional && !(schema.required ?? []).includes(field))
        problems.push(`${name}.${field}: the client needs it, the schema does not promise it`);
      const ours = tsKinds(checker, checker.getTypeOfSymbolAtLocation(prop, decl));
      const allowed = kinds(doc, theirs);
      for (const k of ours) if (!allowed.has(k)) problems.push(`${name}.${field}: ${k} here, ${[...allowed]} in the schema`);
      for (const k of allowed) if (!ours.has(k)) problems.push(`${name}.${field}: the schema allows ${k}, the client does not`);
    }
    for (const field of schema.required ?? []) if (!fields.has(field)) problems.push(`${name}.${field}: required by the schema, unknown here`);
  }
  assert.deepEqual(problems, []);
});
