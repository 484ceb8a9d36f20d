#!/usr/bin/env python3
"""scripts/make-report on a small bench_e2e output (tests/data/bench_e2e_small.json: a real run, one task kind,
16 tokens a task, 2026-12-06), and on variants of it: the report is written, every table's rows have its header's
cell count, every speculative run gets a row, and nothing is cut off (cost widths, acceptance positions).

usage: test_make_report.py MAKE_REPORT FIXTURE
Prints one line per check and a closing 'N passed, N failed' line; exits non-zero on any failure.
"""
import copy
import json
import os
import re
import subprocess
import sys
import tempfile

make_report, fixture = sys.argv[1], sys.argv[2]
with open(fixture) as f:
    base = json.load(f)
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok: {name}")
    else:
        failed += 1
        print(f"FAILED: {name}: {detail}")


def tables(text):
    """The markdown tables of a report: lists of rows, each a list of cells."""
    found, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif current:
            found.append(current)
            current = []
    return found


def report(results, name):
    """Runs make-report on `results`; returns (report text, speedup.dat text), or None after a failed check."""
    with tempfile.TemporaryDirectory() as out:
        path = os.path.join(out, "results.json")
        with open(path, "w") as f:
            json.dump(results, f)
        r = subprocess.run([sys.executable, make_report, path, out], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            check(f"{name}: make-report exits 0", False, r.stderr[-2000:])
            return None
        check(f"{name}: speedup.png written", os.path.getsize(os.path.join(out, "speedup.png")) > 0)
        with open(os.path.join(out, "report.md")) as f, open(os.path.join(out, "speedup.dat")) as g:
            text, data = f.read(), g.read()
    for i, table in enumerate(tables(text)):
        widths = {len(row) for row in table}
        check(f"{name}: table {i + 1} ({table[0][0]}...) has one cell count", len(widths) == 1, str(table[:2]))
    return text, data


def runs(results):
    return [b["name"].split("/iterations")[0] for b in results["benchmarks"]
            if re.match(r"BM_E2E/[^/]+/[^/]+/.+/(k\d+|adaptive)/", b["name"])]


# The run as it is: a row per speculative configuration.
if (out := report(base, "fixture")) is not None:
    text, _ = out
    for name in runs(base):
        kind, mode, draft, k = name.split("/")[1:]
        k = k[1:] if k.startswith("k") else k
        row = f"| {kind} | {mode} | {draft} | {k} |"
        check(f"fixture: a row for {name}", row in text, row)

# Without the cost table's rows (a filtered run): the table is empty, still well formed.
no_costs = copy.deepcopy(base)
no_costs["benchmarks"] = [b for b in base["benchmarks"] if not re.match(r"BM_Cost/[^/]+/(target|draft)/", b["name"])]
report(no_costs, "no cost rows")

# Wider than the fixture: verify widths up to 24 and acceptance at 20 draft positions (k up to 64 is allowed).
wide = copy.deepcopy(base)
w1 = next(b for b in wide["benchmarks"] if re.match(r"BM_Cost/[^/]+/target/w1/", b["name"]))
kind = w1["name"].split("/")[1]
for w in range(2, 25):
    if not any(b["name"].startswith(f"BM_Cost/{kind}/target/w{w}/") for b in wide["benchmarks"]):
        extra = copy.deepcopy(w1)
        extra["name"] = extra["run_name"] = f"BM_Cost/{kind}/target/w{w}/iterations:1/manual_time"
        extra["seconds"] = w1["seconds"] * (1 + 0.1 * w)
        wide["benchmarks"].append(extra)
deep = next(b for b in wide["benchmarks"] if re.match(r"BM_E2E/[^/]+/[^/]+/.+/k\d+/", b["name"]))
for i in range(1, 21):
    deep[f"acc{i}"] = 0.5
if (out := report(wide, "wide")) is not None:
    text, data = out
    check("wide: the cost table shows t_v(24)", "t_v(24)/t_AR" in text)
    check("wide: the acceptance data reaches draft position 20", re.search(r"^20 0\.5$", data, re.M) is not None)

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
