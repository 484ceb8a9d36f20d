#!/usr/bin/env python3
"""The benchmarks' settings: a bad environment variable ends the run at once with exit status 2 and one line
on stderr that names the variable and its value, never std::terminate (an abort) or a silent default.

usage: test_bench_settings.py BENCH_LLAMA_FORWARD BENCH_E2E
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

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
