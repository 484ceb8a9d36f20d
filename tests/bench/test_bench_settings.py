#!/usr/bin/env python3
"""The benchmarks' settings: a bad environment variable ends the run at once with exit status 2 and one line
on stderr that names the variable and its value, never std::terminate (an abort) or a silent default.

usage: test_bench_settings.py BENCH_LLAMA_FORWARD BENCH_E2E [MODEL]
(MODEL, SmolLM2's GGUF file, for the check of an early-exit draft deeper than the model.)
Prints one line per check and a closing 'N passed, N failed' line; exits non-zero on any failure.
"""
import os
import subprocess
import sys

forward, e2e = sys.argv[1], sys.argv[2]
passed = failed = 0


def check(binary, settings, expected, args=()):
    global passed, failed
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDEC_")}
    env.update(settings)
    r = subprocess.run([binary, *args], env=env, capture_output=True, text=True, timeout=120)
    name = f"{os.path.basename(binary)} {settings}"
    lines = r.stderr.strip().splitlines()
    ok = r.returncode == 2 and len(lines) == 1 and expected in lines[0] and "terminate" not in r.stderr
    if ok:
        passed += 1
        print(f"ok: {name}: {lines[0]}")
    else:
        failed += 1
        print(f"FAILED: {name}: exit {r.returncode}, stderr {r.stderr!r}, expected {expected!r}")


# Per binary, a filter naming one benchmark, so that a setting that were not checked would run it (and this test
# would see exit 0) instead of ending at once; then (variable, value, what the message must contain).
cases = [
    (forward, "BM_LlamaForward_quantized_dot/1/", [
        ("SPECDEC_CONTEXT", "abc", "SPECDEC_CONTEXT 'abc' is not a whole number"),
        ("SPECDEC_CONTEXT", "-5", "SPECDEC_CONTEXT '-5'"),
        ("SPECDEC_THREADS", "0", "SPECDEC_THREADS '0' is not a whole number from 1"),
        ("SPECDEC_THREADS", "2x", "SPECDEC_THREADS '2x'"),
        ("SPECDEC_KV_FORMAT", "f8", "SPECDEC_KV_FORMAT 'f8' is not f16, f32 or q8"),
        ("SPECDEC_MODEL", "/nonexistent/model.gguf", "'/nonexistent/model.gguf'"),
    ]),
    (e2e, "BM_Cost/clock/start", [
        ("SPECDEC_THREADS", "two", "SPECDEC_THREADS 'two' is not a whole number"),
        ("SPECDEC_BENCH_TOKENS", "0", "SPECDEC_BENCH_TOKENS '0'"),
        ("SPECDEC_BENCH_SEEDS", "0", "SPECDEC_BENCH_SEEDS '0'"),
        ("SPECDEC_BENCH_REPEATS", "1e3", "SPECDEC_BENCH_REPEATS '1e3'"),
        ("SPECDEC_BENCH_KS", "1,0", "SPECDEC_BENCH_KS: draft length '0'"),
        ("SPECDEC_BENCH_DRAFTS", "ngram:x", "draft 'ngram:x': n-gram length 'x'"),
        ("SPECDEC_BENCH_DRAFTS", "early-exit:", "draft 'early-exit:': layers ''"),
        ("SPECDEC_BENCH_DRAFTS", "lookahead", "unknown benchmark draft 'lookahead'"),
        ("SPECDEC_MODEL", "/nonexistent/model.gguf", "'/nonexistent/model.gguf'"),
    ]),
]
for binary, benchmark, settings in cases:
    for variable, value, expected in settings:
        check(binary, {variable: value}, expected, [f"--benchmark_filter={benchmark}"])

# An early-exit draft deeper than the model: refused when the run starts, not after its baselines (SmolLM2 has 30
# layers).
model = sys.argv[3] if len(sys.argv) > 3 else ""
if os.path.exists(model):
    check(e2e, {"SPECDEC_MODEL": model, "SPECDEC_BENCH_DRAFTS": "ngram,early-exit:31"},
          "draft 'early-exit:31': the model", ["--benchmark_filter=BM_Cost/clock/start"])
else:
    print(f"skipped: the early-exit depth check needs the model file, {model or 'not given'} (scripts/fetch-model)")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
