// The source maps of an unpacked npm tarball resolve inside it: every
// `*.js` / `*.d.ts` that names a map (`sourceMappingURL`) has it in the
// package, and every source a map names is either a file of the package or
// carried in the map (`sourcesContent`). A debugger or an editor's "go to
// definition" in a consumer's project then lands on the TypeScript source,
// not on a path that only existed in the clone it was built in.
//
// Usage: node tests/typescript/sourcemaps.mjs PACKAGE_DIR   (the tarball's
// `package/`). Exits 1 naming each map that points outside it.
import { readFileSync, readdirSync, statSync, existsSync } from "node:fs";
import { dirname, join, relative, resolve, sep } from "node:path";

const root = resolve(process.argv[2] ?? "");
if (!process.argv[2] || !existsSync(join(root, "package.json"))) {
  console.error("usage: node sourcemaps.mjs PACKAGE_DIR (with its package.json)");
  process.exit(2);
}

function* files(dir) {
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) yield* files(path);
    else yield path;
  }
}

const inside = (path) => path === root || path.startsWith(root + sep);
const problems = [];
let maps = 0;
let sources = 0;
for (const file of files(root)) {
  if (/\.(m?js|d\.m?ts)$/.test(file)) {
    const url = /\/\/# sourceMappingURL=(\S+)\s*$/.exec(readFileSync(file, "utf8"))?.[1];
    if (url !== undefined && !url.startsWith("data:")) {
      const map = resolve(dirname(file), url);
      if (!inside(map) || !existsSync(map)) problems.push(`${relative(root, file)}: its map ${url} is not in the package`);
    }
  }
  if (!file.endsWith(".map")) continue;
  maps += 1;
  const map = JSON.parse(readFileSync(file, "utf8"));
  const base = resolve(dirname(file), map.sourceRoot ?? "");
  (map.sources ?? []).forEach((source, index) => {
    sources += 1;
    if (typeof map.sourcesContent?.[index] === "string") return;
    const path = resolve(base, source);
    if (!inside(path) || !existsSync(path)) {
      problems.push(`${relative(root, file)}: source ${source} is not in the package (nor in sourcesContent)`);
    }
  });
}
if (maps === 0) problems.push("no source map in the package");
if (problems.length > 0) {
  for (const problem of problems) console.error(`sourcemaps: ${problem}`);
  process.exit(1);
}
console.log(`sourcemaps: ${maps} maps, ${sources} sources, all in the package`);
