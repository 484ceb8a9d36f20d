#!/usr/bin/env python3
"""scripts/make-report on a small bench_e2e output (tests/data/bench_e2e_small.json: a real run, one task kind,
16 tokens a task, 2026-12-06), and on variants of it: the report is written, every table's rows have its header's
cell count, every speculative run gets a row, nothing is cut off (cost widths, acceptance positions), and with
counters set by hand every derived figure has its one right value (errors against the cost model and their
summary, the cost model's terms in the runs, the noise of one run, the adaptive goal's cells, the recorded CPU).

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
    check("fixture: no terms sentence without the in_run counters (results before 2026-12-07)",
          "The cost model's terms" not in text)
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

# Known numbers: counters set by hand, so that each figure the report derives has one right value.
known = copy.deepcopy(base)
known["context"].update(cpu_model="Test CPU", cpu_family="99", cpu_model_number="7")
by_name = {b["name"].split("/iterations")[0]: b for b in known["benchmarks"]}
# Fixed-k runs: measured / cost model - 1 = +5%, -20%, none (NaN), +2%, -3%, -12%.
for name, speedup, model in [("chat/greedy/ngram/k1", 1.05, 1.0), ("chat/greedy/ngram/k2", 0.80, 1.0),
                             ("chat/greedy/early-exit:6/k1", 1.0, float("nan")), ("chat/sampled/ngram/k1", 1.02, 1.0),
                             ("chat/sampled/ngram/k2", 0.97, 1.0), ("chat/sampled/early-exit:6/k1", 0.88, 1.0)]:
    by_name["BM_E2E/" + name].update(speedup=speedup, predicted=model)
# The cost model's terms in the runs over their samples: medians 1.05 (six runs), 1.03 (five: one NaN), and for the
# draft term only the two early-exit runs (c >= 0.05; prompt lookup's 0.5 left out): 1.15.
for name, t_ar, verify, draft, c in [("chat/greedy/ngram/k1", 1.00, 0.99, 0.5, 0.003),
                                     ("chat/greedy/ngram/k2", 1.02, 1.01, 0.5, 0.003),
                                     ("chat/greedy/early-exit:6/k1", 1.04, float("nan"), 1.10, 0.4),
                                     ("chat/sampled/ngram/k1", 1.06, 1.03, 0.5, 0.003),
                                     ("chat/sampled/ngram/k2", 1.08, 1.05, 0.5, 0.003),
                                     ("chat/sampled/early-exit:6/k1", 1.10, 1.07, 1.20, 0.4)]:
    by_name["BM_E2E/" + name].update(in_run_t_ar=t_ar, in_run_verify=verify, in_run_draft=draft, c=c)
# An adaptive run's terms are left out: counted, they would move every median.
by_name["BM_E2E/chat/greedy/early-exit:6/adaptive"].update(in_run_t_ar=9.0, in_run_verify=9.0, in_run_draft=9.0, c=0.4)
# Three runs that hardly drafted: their speedups are the noise of one run.
for name, speedup in [("chat/greedy/ngram/adaptive", 0.95), ("chat/greedy/early-exit:6/adaptive", 1.00),
                      ("chat/sampled/early-exit:6/adaptive", 1.05)]:
    by_name["BM_E2E/" + name].update(speedup=speedup, verify_width=1.01)
# The adaptive goal: 0.96 of the best fixed k (met), 0.92 (missed); no fixed k beats plain: 0.98x (met), 0.96x (missed).
for name, fixed, adaptive in [("chat/greedy/ngram", {1: 1.20, 2: 1.00}, 1.152), ("chat/sampled/ngram", {1: 1.20, 2: 1.00}, 1.104),
                              ("chat/greedy/early-exit:6", {1: 0.66}, 0.98), ("chat/sampled/early-exit:6", {1: 0.55}, 0.96)]:
    row = by_name["BM_Interleaved/" + name]
    row.update({f"speedup_k{k}": v for k, v in fixed.items()}, speedup_adaptive=adaptive, best_k=1.0)
by_name["BM_E2E/chat/greedy/plain"].update(mean_decoding_context=300.4, cost_context=310.0)
if (out := report(known, "known")) is not None:
    text, _ = out
    check("known: the machine line names the recorded CPU", "Machine: Test CPU (CPU family 99, model 7), " in text,
          text.splitlines()[2][:120])
    check("known: a row's measured speedup, cost model and error", re.search(
        r"^\| chat \| greedy \| ngram \| 1 \|.*\| 1\.05x \| 1\.00x \| \+5% \|", text, re.M) is not None)
    check("known: a run without a cost model value shows n/a", re.search(
        r"^\| chat \| greedy \| early-exit:6 \| 1 \|.*\| n/a \|", text, re.M) is not None)
    summary = next((line for line in text.splitlines() if line.startswith("Fixed-k runs against the cost model")), "")
    for part in ["3 of 6 within 10%", "largest gap 20%", "mean signed gap -5.6%", "3 runs below the model and 2 above",
                 "1 without a usable model value", "read 0.95-1.05x", "standard deviation 5.0%",
                 "plain decoding's forwards 1.050x t_AR (6 runs)", "the verify calls 1.030x t_v (5 runs)",
                 "the draft calls 1.150x d t_d + u t_u (2 runs with c >= 0.05)"]:
        check(f"known: the summary says '{part}'", part in summary, summary)
    for name, cells in [("greedy | ngram", "k = 1, 1.20x | 1.15x | 0.96 | yes |"),
                        ("sampled | ngram", "k = 1, 1.20x | 1.10x | 0.92 | no |"),
                        ("greedy | early-exit:6", "| 0.98x | 1.48 | yes (vs plain) |"),
                        ("sampled | early-exit:6", "| 0.96x | 1.75 | no (vs plain) |")]:
        check(f"known: the adaptive goal of chat {name}", re.search(
            r"^\| chat \| " + re.escape(name) + r" \|.*" + re.escape(cells), text, re.M) is not None, cells)
    check("known: goals met in 2 of 4", "Goal met in 2 of 4 draft" in text)
    check("known: the plain table's decoding context", "| 300 (cost context 310) |" in text)
unnamed = copy.deepcopy(base)
if (out := report(unnamed, "no cpu recorded")) is not None:
    check("no cpu recorded: the machine line says so", "the results do not name their CPU" in out[0], out[0][:300])

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
