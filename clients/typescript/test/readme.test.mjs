import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { startNode } from "./helpers.mjs";

const pkg = resolve(dirname(fileURLToPath(import.meta.url)), "..");

// Every ```ts block of this client's README and the repository's README is
// a whole program: each is compiled against this package (by its name, as
// a user imports it) and run against a node.
test("the README examples compile and run", async (t) => {
  const n = await startNode(t);
  const dir = mkdtempSync(join(pkg, ".readme-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const blocks = [];
  for (const page of ["README.md", "../../README.md"]) {
    const text = readFileSync(join(pkg, page), "utf8");
    for (const m of text.matchAll(/```ts\n([\s\S]*?)```/g)) blocks.push([page, m[1]]);
  }
  assert.ok(blocks.length >= 2, "no ts blocks found");
  blocks.forEach(([, code], i) => writeFileSync(join(dir, `block${i}.ts`), code.replaceAll("http://127.0.0.1:7419", n.url)));
  writeFileSync(
    join(dir, "tsconfig.json"),
    JSON.stringify({ extends: "../tsconfig.json", compilerOptions: { rootDir: ".", outDir: "out", declaration: false }, include: ["*.ts"] }),
  );
  try {
    execFileSync(join(pkg, "node_modules/.bin/tsc"), ["-p", dir], { stdio: "pipe" });
  } catch (e) {
    assert.fail(`the examples do not compile:\n${e.stdout}${e.stderr}`);
  }
  for (const [i, [page]] of blocks.entries()) {
    let out;
    try {
      out = execFileSync("node", [join(dir, "out", `block${i}.js`)], { env: { ...process.env, LEASEHOLD_ENDPOINT: n.url }, stdio: "pipe", timeout: 30000 });
    } catch (e) {
      assert.fail(`${page}, ts block: ${e.message}\n${e.stdout}${e.stderr}`);
    }
    assert.match(String(out), /fence/, `${page}, ts block printed no fence`);
  }
});
