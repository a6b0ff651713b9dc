// Reads the suite's checks.json files (tests/conformance/run.sh) against the
// baseline files, for the run's log:
//
//   node report.mjs scenario <results-dir> <revision> <scenario> <baseline-dir>
//       the scenario's checks that did not pass, each marked expected (in the
//       baseline), UNEXPECTED, or STALE (listed, but passed)
//   node report.mjs summary <results-dir> <baseline-dir> <revision>...
//       per revision: checks passed, failed unexpectedly, failed as expected
//
// Like the suite, a check id that occurs more than once counts once, with its
// most severe status; a WARNING fails like a FAILURE.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const [mode, resultsDir, ...rest] = process.argv.slice(2);
// The suite's own YAML parser, from its install in .dev/conformance.
const YAML = require(path.resolve(resultsDir, "..", "node_modules", "yaml"));
const SEVERITY = { FAILURE: 3, WARNING: 2, SUCCESS: 1, SKIPPED: 0, INFO: -1 };
const failing = (s) => s === "FAILURE" || s === "WARNING";

function baseline(dir, rev) {
  const doc = YAML.parse(fs.readFileSync(path.join(dir, `${rev}.yaml`), "utf8"));
  return new Set(doc?.server ?? []);
}

// scenario name -> [{id, status, errorMessage}], one per check id.
function results(rev) {
  const out = new Map();
  const dir = path.join(resultsDir, rev);
  for (const d of fs.existsSync(dir) ? fs.readdirSync(dir).sort() : []) {
    const f = path.join(dir, d, "checks.json");
    if (!fs.existsSync(f)) continue;
    const scenario = d.replace(/^server-/, "").replace(/-\d{4}-\d\d-\d\dT.*$/, "");
    const byId = new Map();
    for (const c of JSON.parse(fs.readFileSync(f, "utf8"))) {
      const prev = byId.get(c.id);
      if (!prev || SEVERITY[c.status] >= SEVERITY[prev.status]) byId.set(c.id, c);
    }
    out.set(scenario, [...byId.values()]);
  }
  return out;
}

const listed = (base, scenario, id) => base.has(scenario) || base.has(`${scenario}:${id}`);

if (mode === "scenario") {
  const [rev, scenario, baseDir] = rest;
  const base = baseline(baseDir, rev);
  const checks = results(rev).get(scenario) ?? [];
  if (checks.length === 0) console.log(`    (no checks.json for ${scenario})`);
  for (const c of checks) {
    const inBase = listed(base, scenario, c.id);
    let mark;
    if (failing(c.status)) mark = inBase ? "expected  " : "UNEXPECTED";
    else if (c.status === "SUCCESS" && base.has(`${scenario}:${c.id}`)) mark = "STALE     ";
    else continue;
    const msg = (c.errorMessage ?? "").replace(/\s+/g, " ").slice(0, 300);
    console.log(`    ${mark} ${c.status.padEnd(7)} ${scenario}:${c.id}${msg ? ` — ${msg}` : ""}`);
  }
} else if (mode === "summary") {
  const [baseDir, ...revs] = rest;
  for (const rev of revs) {
    const base = baseline(baseDir, rev);
    const n = { passed: 0, unexpected: 0, expected: 0, skipped: 0, info: 0 };
    for (const [scenario, checks] of results(rev)) {
      for (const c of checks) {
        if (failing(c.status)) n[listed(base, scenario, c.id) ? "expected" : "unexpected"]++;
        else if (c.status === "SUCCESS") n.passed++;
        else if (c.status === "SKIPPED") n.skipped++;
        else n.info++;
      }
    }
    console.log(
      `${rev}: ${n.passed} passed, ${n.unexpected} failed, ${n.expected} expected failures ` +
        `(${n.skipped} skipped, ${n.info} info)`,
    );
  }
} else {
  console.error("usage: report.mjs scenario|summary ...");
  process.exit(2);
}
