#!/usr/bin/env python3
"""End-to-end tests of specdec-generate on the real SmolLM2 file: text, exactness, chat, and error paths.

usage: test_cli.py SPECDEC_GENERATE MODEL_PATH
Prints one line per check and a closing 'N passed, N failed' line; exits non-zero on any failure.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

binary, model = sys.argv[1], sys.argv[2]
passed = failed = 0


def check(name, condition, detail=""):
    global passed, failed
    if condition:
        passed += 1
        print(f"ok: {name}")
    else:
        failed += 1
        print(f"FAILED: {name} {detail}")


def run(*args, timeout=600):
    return subprocess.run([binary, "--model", model, *args], capture_output=True, text=True, timeout=timeout)


def run_json(*args):
    r = run(*args, "--json")
    if r.returncode != 0:
        raise RuntimeError(f"{args}: exit {r.returncode}: {r.stderr}")
    return json.loads(r.stdout)


def tensor_location(path, wanted):
    """(byte offset, GGML type, element count) of tensor `wanted`'s data in the GGUF file at `path`."""
    with open(path, "rb") as f:
        def take(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

        def text():
            return f.read(take("Q"))

        scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

        def value(kind):
            if kind == 8:
                return text()
            if kind == 9:
                item, count = take("I"), take("Q")
                return [value(item) for _ in range(count)]
            return take(scalar[kind])

        assert f.read(4) == b"GGUF"
        take("I")  # version
        tensors, keys = take("Q"), take("Q")
        alignment = 32
        for _ in range(keys):
            key = text()
            v = value(take("I"))
            if key == b"general.alignment":
                alignment = v
        found = None
        for _ in range(tensors):
            name, dims = text(), take("I")
            shape = [take("Q") for _ in range(dims)]
            kind, offset = take("I"), take("Q")
            if name == wanted.encode():
                count = 1
                for d in shape:
                    count *= d
                found = (offset, kind, count)
        start = (f.tell() + alignment - 1) // alignment * alignment
    return start + found[0], found[1], found[2]


# Greedy continuation of the plugin's own test prompt names the capital.
out = run_json("--prompt", "The capital of France is", "--max-tokens", "16", "--draft", "none")
check("'The capital of France is' continues with Paris", "Paris" in out["text"], out["text"])
check("json has the documented fields",
      all(k in out for k in ("text", "tokens", "prompt_tokens", "format", "kv_format", "stats")) and
      all(k in out["stats"] for k in ("rounds", "drafted", "accepted", "acceptance_rate", "target_calls",
                                      "draft_calls", "seconds", "tokens_per_second")), str(out.keys()))
check("the defaults: quantized_dot weights, an f16 KV cache", (out["format"], out["kv_format"]) == ("quantized_dot", "f16"),
      str((out.get("format"), out.get("kv_format"))))

# Greedy speculative output equals plain output, for several prompts and drafts.
prompts = [
    ("The capital of France is", False),
    ("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", False),
    ("Repeat this list exactly: apples, pears, plums, cherries, apples, pears, plums, cherries.", True),
]
for prompt, chat in prompts:
    for draft in ("ngram", "ngram:2", "early-exit:6", "early-exit:20"):
        args = ["--prompt", prompt, "--max-tokens", "40", "--draft", draft, "--k", "5", "--compare"]
        if chat:
            args.append("--chat")
        out = run_json(*args)
        check(f"greedy {draft} == plain on {prompt[:24]!r}", out["identical"] and out["tokens"] == out["plain"]["tokens"],
              f"{out['tokens']} vs {out['plain']['tokens']}")

# The model's own file as --draft PATH: opened again as a second model, whose logits have the same bits (batch
# invariance), so greedy decoding accepts every drafted token and keeps the plain tokens.
out = run_json("--prompt", "The capital of France is", "--max-tokens", "24", "--draft", model, "--k", "4", "--compare")
check("--draft PATH: the model as its own draft accepts every drafted token",
      out["identical"] and out["stats"]["drafted"] > 0 and out["stats"]["accepted"] == out["stats"]["drafted"],
      str(out["stats"]))

# The f32 and q8 KV caches (not the default) keep greedy speculative == plain too, and still find Paris.
for kv_format in ("f32", "q8"):
    out = run_json("--prompt", "The capital of France is", "--max-tokens", "24", "--draft", "early-exit:10", "--k", "3",
                   "--kv-format", kv_format, "--compare")
    check(f"--kv-format {kv_format} reaches the model", out["kv_format"] == kv_format, str(out.get("kv_format")))
    check(f"--kv-format {kv_format}: greedy early-exit == plain", out["identical"] and out["tokens"] == out["plain"]["tokens"])
    check(f"--kv-format {kv_format}: continues with Paris", "Paris" in out["text"], out["text"])

# Adaptive draft length and coupled sampling keep the plain tokens; rejection sampling is reproducible by seed.
out = run_json("--prompt", "Once upon a time", "--max-tokens", "40", "--adaptive", "--k", "6", "--compare")
check("adaptive greedy == plain", out["identical"])
check("json reports the draft length of every round", len(out["stats"]["draft_lengths"]) == out["stats"]["rounds"])
out = run_json("--prompt", "Once upon a time", "--max-tokens", "40", "--temp", "0.8", "--top-p", "0.9",
               "--sampling", "coupled", "--draft", "early-exit:12", "--compare", "--seed", "7")
check("coupled sampling speculative == plain coupled sampling", out["identical"])
a = run_json("--prompt", "Once upon a time", "--max-tokens", "30", "--temp", "0.9", "--seed", "3")
b = run_json("--prompt", "Once upon a time", "--max-tokens", "30", "--temp", "0.9", "--seed", "3")
check("rejection sampling: same seed, same tokens", a["tokens"] == b["tokens"])

# A chat question gets an answer that ends with <|im_end|> (id 2) within 200 tokens.
out = run_json("--chat", "--prompt", "What is the capital of France? Answer in one sentence.", "--max-tokens", "200")
check("chat answer ends with <|im_end|> within 200 tokens", out["tokens"] and out["tokens"][-1] == 2 and
      len(out["tokens"]) <= 200, str(out["tokens"][-5:]))
check("chat answer mentions Paris", "Paris" in out["text"], out["text"])

# Room for more positions than the model was trained on (8192) is allowed, with one warning on stderr; none
# where the request stays inside.
r = run("--chat", "--prompt", "What is the capital of France? Answer in one sentence.", "--max-tokens", "8200",
        "--max-context", "8300", "--json")
check("a request past the trained context runs, with a warning naming it",
      r.returncode == 0 and json.loads(r.stdout)["tokens"][-1:] == [2] and
      "reach past the model's trained context of 8192 positions" in r.stderr, r.stderr)
r = run("--prompt", "Hi", "--max-tokens", "8200", "--max-context", "8300", "--draft", "/nonexistent/draft.gguf")
check("a failing request past the trained context prints its error alone", r.returncode == 2 and
      len(r.stderr.splitlines()) == 1 and "warning" not in r.stderr, r.stderr)
check("no such warning inside the trained context", "trained context" not in run(
    "--prompt", "The capital of France is", "--max-tokens", "4", "--json").stderr)

# A flag that changes nothing in a run is named on stderr, one line each; flags that take effect raise nothing.
r = run("--prompt", "The capital of France is", "--max-tokens", "4", "--draft", "none", "--k", "3", "--seed", "5",
        "--top-p", "0.9", "--json")
check("flags without effect are named, one warning each", r.returncode == 0 and r.stderr.splitlines() == [
    "specdec-generate: warning: --k has no effect with --draft none (plain decoding)",
    "specdec-generate: warning: --seed has no effect at --temp 0 (greedy)",
    "specdec-generate: warning: --top-p has no effect at --temp 0 (greedy)"], r.stderr)
r = run("--prompt", "The capital of France is", "--max-tokens", "4", "--k", "3", "--adaptive", "--temp", "0.7",
        "--seed", "5", "--top-k", "40", "--top-p", "0.9", "--sampling", "coupled", "--json")
check("flags that take effect raise no warning", r.returncode == 0 and r.stderr == "", r.stderr)
# More threads than either count of this machine's CPUs (online ones, and those this process may run on).
threads = max(os.cpu_count() or 1, len(os.sched_getaffinity(0))) + 1
if threads <= 256:
    r = run("--prompt", "Hi", "--max-tokens", "1", "--threads", str(threads), "--json")
    warning = re.fullmatch(r"specdec-generate: warning: --threads (\d+) is more than the (\d+) hardware threads here; "
                           r"the workers then take turns on the cores, which is much slower\n", r.stderr)
    check("more threads than hardware threads runs, with a warning naming both", r.returncode == 0 and warning and
          int(warning[1]) == threads and int(warning[2]) < threads, r.stderr)

# The context holds the prompt and every new token but the last, which is never fed back: exactly that fits.
prompt_tokens = run_json("--max-tokens", "1", "--draft", "none")["prompt_tokens"]
for draft in ("none", "ngram", "early-exit:8"):
    out = run_json("--max-tokens", "4", "--max-context", str(prompt_tokens + 3), "--draft", draft)
    check(f"prompt + --max-tokens - 1 positions fit --max-context exactly (--draft {draft})",
          len(out["tokens"]) == 4, str(out["tokens"]))
r = run("--max-tokens", "5", "--max-context", str(prompt_tokens + 3))
check("one position more is refused", r.returncode == 2 and "exceeds --max-context" in r.stderr, r.stderr)

# Text mode streams the text and prints a summary.
r = run("--prompt", "The capital of France is", "--max-tokens", "8", "--compare")
check("text mode streams the continuation", r.returncode == 0 and r.stdout.startswith("The capital of France is"), r.stdout)
check("text mode prints speedup and identity", "tokens identical: yes" in r.stderr, r.stderr)
# On a terminal both streams share one screen: the text's last line ends before the summary starts.
r = subprocess.run([binary, "--model", model, "--prompt", "The capital of France is", "--max-tokens", "8"],
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
check("the summary starts on a line of its own", "\nspeculative: 8 tokens" in r.stdout, repr(r.stdout))

# A generation can stop inside a character (here SmolLM2 writes each emoji as two tokens): the streamed text is
# still valid UTF-8, each byte left over written as U+FFFD, the same text as --json's.
emoji = "Emoji list: \U0001F600 \U0001F603 \U0001F604 \U0001F601"
cut = next((n for n in range(12, 25) if run_json("--prompt", emoji, "--max-tokens", str(n), "--draft", "none")
            ["text"].endswith("\ufffd")), None)
check("some --max-tokens in 12..24 ends the emoji list inside a character", cut is not None)
if cut is not None:
    r = subprocess.run([binary, "--model", model, "--prompt", emoji, "--max-tokens", str(cut)], capture_output=True)
    text = run_json("--prompt", emoji, "--max-tokens", str(cut))["text"]
    try:
        streamed = r.stdout.decode("utf-8")
    except UnicodeDecodeError as e:
        streamed = None
        check("a character cut at the end streams as valid UTF-8", False, f"{e}: {r.stdout[-16:]!r}")
    if streamed is not None:
        check("a character cut at the end streams as valid UTF-8, as the JSON text",
              r.returncode == 0 and streamed == emoji + text + "\n", f"{streamed!r} against {text!r}")

# Error paths: one line on stderr, exit code 2, never a crash.
errors = [
    (["--bogus"], "unknown argument '--bogus'"),
    (["--k"], "--k needs a value"),
    (["--k", "four"], "--k expects a number, got 'four'"),
    (["--temp", "-1"], "temperature must be a finite number >= 0, got -1"),
    (["--top-p", "0"], "top_p must be in (0, 1], got 0"),
    (["--top-p", "1.5"], "top_p must be in (0, 1], got 1.5"),
    (["--draft", "early-exit:0"], "--draft early-exit:L needs L of 1 or more, got 0"),
    (["--draft", "early-exit:30"], "--draft early-exit:L needs L in 1..29, got 30"),
    (["--draft", "ngram:0"], "--draft ngram:N needs N in 1..16, got 0"),
    (["--draft", "/nonexistent/draft.gguf"], "/nonexistent/draft.gguf"),
    (["--draft", "NGRAM"], "--draft expects none, ngram, ngram:N, early-exit:L or the path of a GGUF file, got 'NGRAM' "
                           "(no such file)"),
    (["--sampling", "magic"], "--sampling expects rejection or coupled, got 'magic'"),
    (["--format", "int3"], "--format expects f32, bf16, bf16_dot, quantized or quantized_dot, got 'int3'"),
    (["--kv-format", "q4"], "--kv-format expects f16, f32 or q8, got 'q4'"),
    (["--threads", "0"], "--threads must be in 1..256, got 0"),
    (["--prompt", ""], "--prompt is empty"),
    (["--max-context", "8", "--max-tokens", "16"], "exceeds --max-context 8"),
    (["--max-context", "9223372036854775808"], "--max-context must be in 1..131072, got 9223372036854775808"),
    (["--max-context", "12", "--max-tokens", "18446744073709551615"], "exceeds --max-context 12"),
    (["--k", "0"], "--k must be in 1..64, got 0"),
    (["--temp", "1e40"], "--temp is out of range, got '1e40'"),
    # Control bytes from the command line are escaped: the error stays on one line, nothing reaches a terminal.
    (["--sampling", "a\nb\x1b[2J"], "--sampling expects rejection or coupled, got 'a\\nb\\x1b[2J'"),
]
# A value left out before the next flag is named as such, not taken as the value (the prompt "--chat") or
# reported as the flag's stray value ("unknown argument '4'"): every flag --help lists, after --prompt.
help_flags = sorted(set(re.findall(r"^  (--[a-z-]+)", run("--help").stdout, re.M)))
check("--help lists the flags", len(help_flags) >= 18, help_flags)
errors += [(["--prompt", f], f"--prompt needs a value, got the flag '{f}'") for f in help_flags]
errors += [(["--draft", "--max-tokens", "4"], "--draft needs a value, got the flag '--max-tokens'"),
           (["--k", "-h"], "--k needs a value, got the flag '-h'")]
for args, message in errors:
    r = run(*args)
    lines = r.stderr.strip().splitlines()
    check(f"error {args}", r.returncode == 2 and len(lines) == 1 and message in lines[0] and r.stdout == "",
          f"rc={r.returncode} {r.stderr!r} stdout {r.stdout!r}")
for prompt, message in [(b"\xff\xfe", b"--prompt byte 0xFF at offset 0 has no token"),
                        (b"The capital\xfe of France is", b"--prompt byte 0xFE at offset 11 has no token"),
                        (b"tab\tEOT\x04", b"--prompt byte 0x04 at offset 7 has no token")]:
    r = subprocess.run([binary.encode(), b"--model", model.encode(), b"--prompt", prompt, b"--max-tokens", b"2"],
                       capture_output=True)
    check(f"a prompt with a byte without a token {prompt!r}",
          r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1 and r.stdout == b"",
          r.stderr)
r = subprocess.run([binary, "--model", "/nonexistent/model.gguf"], capture_output=True, text=True)
check("missing model file", r.returncode == 2 and "/nonexistent/model.gguf" in r.stderr, r.stderr)
with open(sys.argv[0], "rb") as f:
    not_gguf = f.read()
with tempfile.NamedTemporaryFile(suffix=".gguf") as tmp:
    tmp.write(not_gguf)
    tmp.flush()
    r = subprocess.run([binary, "--model", tmp.name], capture_output=True, text=True)
    check("a file that is not GGUF", r.returncode == 2 and "magic" in r.stderr, r.stderr)
    r = run("--draft", tmp.name)
    check("a draft file that is not GGUF", r.returncode == 2 and "magic" in r.stderr and r.stdout == "", r.stderr)

with tempfile.TemporaryDirectory() as tmp:
    fifo = f"{tmp}/model.gguf"
    os.mkfifo(fifo)  # opening a FIFO without a writer would wait for one
    for flag, args in (("--model", ["--model", fifo]), ("--draft", ["--model", model, "--draft", fifo])):
        try:
            r = subprocess.run([binary, *args, "--max-tokens", "2"], capture_output=True, text=True, timeout=60)
            check(f"a FIFO as {flag}", r.returncode == 2 and "not a regular file" in r.stderr and
                  len(r.stderr.strip().splitlines()) == 1, r.stderr)
        except subprocess.TimeoutExpired:
            check(f"a FIFO as {flag}", False, "hung for 60 s")
# --help prints the usage on stdout, exit code 0, whatever follows it; every option of the synopsis is in it.
r = subprocess.run([binary, "--help", "--bogus"], capture_output=True, text=True)
missing = [o for o in ("--model", "--prompt", "--chat", "--draft", "--k", "--max-tokens", "--temp", "--top-k", "--top-p",
                       "--seed", "--threads", "--compare", "--json") if f"\n  {o} " not in r.stdout]
check("--help prints the usage", r.returncode == 0 and r.stdout.startswith("usage: specdec-generate") and not missing
      and r.stderr == "", f"rc={r.returncode} missing {missing} stderr {r.stderr!r}")
with open("/dev/full", "w") as full:  # every write fails: the output is lost, and the tool says so
    r = subprocess.run([binary, "--help"], stdout=full, stderr=subprocess.PIPE, text=True)
    check("--help to stdout that cannot be written",
          r.returncode == 2 and r.stderr.strip().endswith("cannot write to standard output"), r.stderr)
# An error after the text began streaming ends the streamed line first, so that the one-line error stands on its
# own line. The model's final norm weights are 3e38: finite, so the file loads, but the output head's products
# overflow and the first logits are not finite. A NaN weight is refused as the file loads, naming the tensor.
with tempfile.TemporaryDirectory() as tmp:
    for value, name in ((3e38, "huge"), (float("nan"), "nan")):
        bad_model = f"{tmp}/{name}.gguf"
        shutil.copyfile(model, bad_model)
        offset, kind, count = tensor_location(bad_model, "output_norm.weight")
        assert kind == 0, kind  # f32
        with open(bad_model, "r+b") as f:
            f.seek(offset)
            f.write(struct.pack("<f", value) * count)
        r = subprocess.run([binary, "--model", bad_model, "--max-tokens", "4"], capture_output=True, text=True,
                           timeout=600)
        if name == "huge":
            check("an error after the text began starts on a line of its own",
                  r.returncode == 2 and r.stdout == "The capital of France is\n" and
                  len(r.stderr.strip().splitlines()) == 1 and "target returned a non-finite logit (" in r.stderr,
                  f"rc={r.returncode} stdout {r.stdout!r} stderr {r.stderr!r}")
        else:
            check("a NaN weight is an error naming the tensor, before any text",
                  r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and
                  f"{bad_model}: tensor output_norm.weight holds nan at row 0, column 0" in r.stderr,
                  f"rc={r.returncode} stdout {r.stdout!r} stderr {r.stderr!r}")
with open("/dev/full", "w") as full:  # every write fails: the output is lost, and the tool says so
    for mode in ([], ["--json"]):
        r = subprocess.run([binary, "--model", model, "--max-tokens", "2", *mode], stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=600)
        check(f"stdout that cannot be written {mode}",
              r.returncode == 2 and r.stderr.strip().endswith("cannot write to standard output"), r.stderr)

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
