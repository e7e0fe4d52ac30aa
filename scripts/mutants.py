#!/usr/bin/env python3
"""Mutation testing for dtrain: small single edits ("mutants") of src/*.c, each built in a scratch
copy of the tree and run against the fast tests that cover its module; a mutant the tests do not
notice ("survived") marks a hole in the tests, or is equivalent to the original (listed with the
reason in tests/mutants/equivalent.txt).

  mutants.py list  [-m MODULE ...]                         every mutant: id, module, file:line, edit
  mutants.py run   [-m MODULE ...] [-n N | --all | --ids ID,...] [--seed S] [--results FILE] [--work DIR]
  mutants.py check [--work DIR]                            the fixed sample (make check-mutants)
  mutants.py report FILE...                                per-module table of results files

Mutants (regular expressions over the C text, like universalmutator's C rules; comments, strings,
preprocessor lines and the arguments of printf/fprintf/DT_ERR/assert are never mutated: the
messages are not behaviour): binary + - * / % << swapped, compound assignments, ++/--, relational
and equality operators shifted (< to <=, == to !=, ...), && and || swapped, a logical ! dropped,
an if condition negated, integer literals (0 -> 1, 1 -> 0, k -> k+1), float literals doubled,
DT_AVG/DT_SUM and DT_MAX/DT_MIN swapped, and a one-line expression statement or break/continue
deleted. A mutant's id is a hash of its file, the text of its line, the column and the edit, so
it survives edits elsewhere in the file.

Each mutant: the scratch tree (WORK/tree, configured once without CUDA, data copied from the
build tree) gets the mutated file, `make` rebuilds the targets its tests need (a failed build is
"invalid"), its module's tests run fastest first, each under a time limit (a mutant that hangs
is "timeout", counted as killed), the first failing test kills it; then the file and its object
are put back. Results: one JSON line per mutant (WORK/results.jsonl unless --results).
`run` samples N mutants per module (fixed seed) or runs --all; `check` is MODULES' fixed sample
(CHECK_PER_MODULE per module, seed CHECK_SEED; those listed in equivalent.txt are skipped) and
exits 1 if one of the others survives. The long campaign: `nice -n 19 scripts/mutants.py run --all &`.
"""
import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EQUIV = os.path.join(SRC, "tests", "mutants", "equivalent.txt")

# Module -> its files and the tests that cover it, fastest first: (kind, name, targets to build).
# kind "crit": a Criterion program run directly; "sh": a script test run as make check would.
T_OPTIM = ("crit", "tests/test_optim", ["tests/test_optim"])
T_MODEL = ("crit", "tests/test_model", ["tests/test_model"])
T_ZERO = ("crit", "tests/test_zero", ["tests/test_zero"])
T_PIPE = ("crit", "tests/test_pipeline", ["tests/test_pipeline"])
T_PREC = ("crit", "tests/test_precision", ["tests/test_precision"])
T_REF = ("sh", "tests/ref_gpt2.sh", ["tests/ref_dump"])
T_TRAINER = ("sh", "tests/ref_trainer.sh", ["dtrain"])
T_DDPU = ("crit", "tests/test_ddp", ["tests/test_ddp"])
T_DDP = ("sh", "tests/ddp_equiv.sh", ["dtrain"])
T_ZMPI = ("sh", "tests/zero_mpi.sh", ["tests/test_zero_mpi"])
T_ZEQ = ("sh", "tests/zero_equiv.sh", ["dtrain"])
T_PPEQ = ("sh", "tests/pp_equiv.sh", ["dtrain"])
T_TPEQ = ("sh", "tests/tp_equiv.sh", ["dtrain"])
T_SCALER = ("sh", "tests/precision_scaler.sh", ["dtrain"])
T_PTRAIN = ("sh", "tests/precision_train.sh", ["dtrain"])
T_CKPT = ("sh", "tests/ckpt_mpi.sh", ["tests/test_ckpt"])
T_CKLEAK = ("sh", "tests/ckpt_leaks.sh", ["tests/test_ckpt_asan"])
T_TPRS = ("sh", "tests/tp_reshard.sh", ["dtrain"])
T_RESUME = ("sh", "tests/resume_exact.sh", ["dtrain"])
T_LAYOUT = ("sh", "tests/resume_layout.sh", ["dtrain"])
T_FAULTS = ("sh", "tests/ckpt_faults.sh", ["dtrain"])
T_DATAU = ("crit", "tests/test_data", ["tests/test_data"])
T_REFCNN = ("sh", "tests/ref_cnn.sh", ["tests/cnn_dump", "tests/cnn_model_dump"])
T_IMAGES = ("sh", "tests/images.sh", ["tests/images_dump"])
T_CNNTRAIN = ("sh", "tests/cnn_train.sh", ["dtrain"])
T_CONFIG = ("crit", "tests/test_config", ["tests/test_config"])
T_CNNU = ("crit", "tests/test_cnn", ["tests/test_cnn"])  # bounds, writes past arrays, leaks
T_EMUCNN = ("sh", "tests/emu_cnn.sh", ["dtrain", "dtrain_emu"])  # the device backend's staging (emulated)
T_CNNSYNC = ("sh", "tests/cnn_sync.sh", ["dtrain"])  # the CNNs' sync strategies, ZeRO-3's hooks among them
T_EMUMP = ("sh", "tests/emu_mp.sh", ["dtrain", "dtrain_emu"])  # ZeRO's device paths (the CUDA backend, emulated)
MODULES = {
    "model": (["src/model/model.c"], [T_MODEL, T_PIPE, T_TRAINER, T_TPEQ, T_PPEQ]),
    "optimizer": (["src/model/optim.c"], [T_OPTIM, T_TRAINER]),
    "ddp": (["src/parallel/ddp.c"], [T_DDPU, T_DDP, T_TRAINER]),
    "zero": (["src/parallel/zero.c"], [T_ZERO, T_ZMPI, T_ZEQ, T_EMUMP]),
    "pipeline": (["src/parallel/pipeline.c"], [T_PIPE, T_PPEQ]),
    "precision": (["src/core/precision.c"], [T_PREC, T_SCALER, T_PTRAIN]),
    "checkpoint": (["src/ckpt/ckpt.c", "src/ckpt/ckpt_write.c", "src/ckpt/ckpt_own.c", "src/ckpt/ckpt_read.c", "src/ckpt/ckpt_meta.c",
                    "src/ckpt/ckpt_dir.c"],
                   [T_RESUME, T_CKLEAK, T_CKPT, T_FAULTS, T_LAYOUT, T_TRAINER, T_TPRS]),  # quick killers first
    # the ini and command-line keys: parsing, ranges, the combinations validate refuses (campaigns only)
    "config": (["src/core/config.c"], [T_CONFIG]),
    "winograd": (["src/backend/conv_winograd.c"], [T_CNNU, T_REFCNN]),
    # issue #25's CNN layers, models and image sets (campaigns only: not yet in check's sample)
    "cnn": (["src/backend/ops_cnn_cpu.c", "src/model/cnn.c", "src/model/cnn_build.c", "src/data/images.c",
             "src/data/sampler.c", "src/app/train_cnn.c",
             "src/app/train_cnn_ckpt.c"], [T_CNNU, T_DATAU, T_REFCNN, T_IMAGES, T_CNNTRAIN, T_CNNSYNC, T_EMUCNN]),
}
# `check` (make check-mutants, CI) samples the seven modules of issue #28's goal
CHECK_MODULES = ["model", "optimizer", "ddp", "zero", "pipeline", "precision", "checkpoint"]
CHECK_SEED, CHECK_PER_MODULE = 28, 4  # 5 until 2026-11-30 (CI time: the sample was 5.3 of its 28 minutes)
TIME_LIMIT = {"crit": 120, "sh": 600}  # seconds per test; far above a healthy run on 2 busy cores
# `check` (CI's fixed sample): a script test that runs 3x its healthy time counts as a timeout (so as
# killed): a mutant that corrupts the heap once made tests/ckpt_mpi.sh crawl for 372 s before failing
CHECK_SH_LIMIT = 180

# ---- generating mutants -------------------------------------------------------------------

QUIET_CALLS = re.compile(r"\b(printf|fprintf|DT_ERR|assert|perror|puts|fputs)\s*\(")


def code_mask(text):
    """mask[i] is True where text[i] is C code (not a comment, string, char or preprocessor line)."""
    n, mask, i = len(text), [True] * len(text), 0
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c == "#":  # preprocessor line, with backslash continuations
            j = i
            while j < n and (text[j] != "\n" or text[j - 1] == "\\"):
                j += 1
            mask[i:j] = [False] * (j - i)
            i = j
            continue
        if c == "\n":
            at_line_start = True
        elif not c.isspace():
            at_line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2) + 2
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j += 1
        else:
            i += 1
            continue
        mask[i:j] = [False] * (j - i)
        i = j
    for m in QUIET_CALLS.finditer(text):  # messages and assertions: not behaviour
        if not mask[m.start()]:
            continue
        depth, j = 0, m.end() - 1
        while j < n:
            if mask[j] and text[j] == "(":
                depth += 1
            elif mask[j] and text[j] == ")":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        mask[m.start():j + 1] = [False] * (j + 1 - m.start())
    return mask


# (name, pattern, replacement function of the match); patterns need spaces around binary operators
# (the code is clang-formatted), which keeps pointers, unary minus and includes out.
def _swap(table):
    return lambda m: table[m.group(0).strip()].join(m.group(0).split(m.group(0).strip()))


BINARY = {"+": "-", "-": "+", "*": "/", "/": "*", "%": "*", "<<": ">>", ">>": "<<"}
ASSIGN = {"+=": "-=", "-=": "+=", "*=": "/=", "/=": "*=", "|=": "&=", "&=": "|="}
RELATIONAL = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "=="}
LOGICAL = {"&&": "||", "||": "&&"}
NAMES = {"DT_AVG": "DT_SUM", "DT_SUM": "DT_AVG", "DT_MAX": "DT_MIN", "DT_MIN": "DT_MAX"}


def _int_literal(m):
    k = int(m.group(1))
    return (str(1 if k == 0 else 0 if k == 1 else k + 1)) + m.group(2)


def _float_literal(m):
    s = m.group(0)
    suffix = "f" if s[-1] in "fF" else ""
    v = float(s.rstrip("fF"))
    return repr(v * 2 if v != 0 else 1.0) + suffix


OPERATORS = [
    ("binary", re.compile(r" (\+|-|\*|/|%|<<|>>) (?!=)"), _swap(BINARY)),
    ("assign", re.compile(r" (\+=|-=|\*=|/=|\|=|&=) "), _swap(ASSIGN)),
    ("incdec", re.compile(r"\+\+|--"), lambda m: "--" if m.group(0) == "++" else "++"),
    ("relational", re.compile(r" (<=|>=|<|>|==|!=) "), _swap(RELATIONAL)),
    ("logical", re.compile(r" (&&|\|\|) "), _swap(LOGICAL)),
    ("not", re.compile(r"!(?!=)"), lambda m: ""),
    ("int", re.compile(r"(?<![\w.])(?<![eE][-+])(\d+)([uUlL]*)(?![\w.])"), _int_literal),
    ("float", re.compile(r"(?<![\w.])(\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+)[fF]?(?![\w.])"), _float_literal),
    ("name", re.compile(r"\b(DT_AVG|DT_SUM|DT_MAX|DT_MIN)\b"), lambda m: NAMES[m.group(0)]),
]
DECL = re.compile(r"^\s*(return\b|else\b|case\b|default\b|(const\s+|static\s+|struct\s+)*[A-Za-z_]\w*\s+\**[A-Za-z_(])")
STMT = re.compile(r"^(\s*)(\S.*;)\s*$")


def balanced(s):
    d = 0
    for ch in s:
        d += (ch == "(") - (ch == ")")
        if d < 0:
            return False
    return d == 0


def mutants_of(path):
    """Every mutant of one file: dicts with id, file, line, col, op, old, new (the whole new line)."""
    text = open(os.path.join(SRC, path)).read()
    mask = code_mask(text)
    out, pos, seen = [], 0, {}
    for lineno, line in enumerate(text.split("\n"), 1):
        seen[line] = seen.get(line, 0) + 1  # identical lines of a file: told apart by their count
        lm = mask[pos:pos + len(line)]
        edits = []
        for op, rx, rep in OPERATORS:
            for m in rx.finditer(line):
                if all(lm[m.start():m.end()]):
                    edits.append((op, m.start(), m.end(), rep(m)))
        for m in re.finditer(r"\bif \(", line):  # negate a condition that closes on this line
            d, j = 0, m.end() - 1
            while j < len(line):
                d += (line[j] == "(") - (line[j] == ")")
                if d == 0:
                    break
                j += 1
            if j < len(line) and all(lm[m.start():j + 1]):
                edits.append(("negate", m.end(), j, "!(" + line[m.end():j] + ")"))
        s = STMT.match(line)
        if s and all(lm[len(s.group(1)):]) and not DECL.match(line) and balanced(s.group(2)) \
                and s.group(2).count(";") == 1 and not s.group(2).startswith(("{", "}", "for", "if", "while")):
            edits.append(("delete", len(s.group(1)), len(line), ";"))
        for op, a, b, new in edits:
            mutated = line[:a] + new + line[b:]
            if mutated == line:
                continue
            # keyed by src/<file name> as before the folders (src/<layer>/), so tests/mutants/equivalent.txt's ids hold
            key = f"src/{os.path.basename(path)}\0{line}\0{seen[line]}\0{a}\0{op}\0{new}".encode()
            out.append({"id": hashlib.sha1(key).hexdigest()[:12], "file": path, "line": lineno, "col": a + 1,
                        "op": op, "old": line.strip(), "new": mutated.strip()})
        pos += len(line) + 1
    return out


def all_mutants(modules):
    return {mod: [m for f in MODULES[mod][0] for m in mutants_of(f)] for mod in modules}


def sample(muts, n, seed):
    """n mutants of a module's list, the same ones for the same code and seed."""
    ordered = sorted(muts, key=lambda m: m["id"])
    return ordered if n is None or n >= len(ordered) else random.Random(seed).sample(ordered, n)


def load_equivalent():
    """id -> reason, from tests/mutants/equivalent.txt (lines: ID  file:line  reason)."""
    eq = {}
    if os.path.exists(EQUIV):
        for line in open(EQUIV):
            line = line.strip()
            if line and not line.startswith("#"):
                parts = line.split(None, 2)
                eq[parts[0]] = parts[2] if len(parts) > 2 else ""
    return eq


# ---- the scratch tree ---------------------------------------------------------------------

def sh(cmd, cwd, log, timeout=None, env=None):
    """Run cmd (a list) in its own process group, output appended to log; the exit status, or
    None when it ran past timeout (the whole group is killed: mpirun and its ranks too)."""
    with open(log, "a") as out:
        out.write(f"+ {' '.join(cmd)}\n")
        out.flush()
        p = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()
            return None
        except BaseException:  # interrupted: take the test down with us
            os.killpg(p.pid, 9)
            raise


def source_files():
    try:
        out = subprocess.run(["git", "-C", SRC, "ls-files"], capture_output=True, text=True, check=True).stdout
        return [f for f in out.splitlines() if os.path.isfile(os.path.join(SRC, f))]
    except (OSError, subprocess.CalledProcessError):  # a release tarball: its top-level files and folders
        keep = ("src/", "cuda/", "tests/", "scripts/", "m4/", "inputs/", "docs/", "validation/", "bench/", "sbatch/")
        files = []
        for root, _, names in os.walk(SRC):
            for n in names:
                rel = os.path.relpath(os.path.join(root, n), SRC)
                if rel.startswith(keep) or rel in ("configure.ac", "Makefile.am", "README.md", "AUTHORS"):
                    files.append(rel)
        return files


def stamp_of(files):
    h = hashlib.sha1()
    for f in sorted(files):
        h.update(f.encode() + b"\0" + open(os.path.join(SRC, f), "rb").read())
    return h.hexdigest()


def all_targets():
    return sorted({t for _, tests in MODULES.values() for _, _, targets in tests for t in targets})


def prepare(work, data, log):
    """WORK/tree: a copy of the sources, configured without CUDA and built, unless one of exactly
    these sources is there already; WORK/pristine: the objects of the files that get mutated."""
    files = source_files()
    stamp, tree = stamp_of(files), os.path.join(work, "tree")
    stamp_file = os.path.join(work, "stamp")
    if os.path.exists(stamp_file) and open(stamp_file).read() == stamp:
        return tree
    print(f"mutants: preparing {tree} (copy, configure --without-cuda, build; log {log})", flush=True)
    for d in (tree, os.path.join(work, "pristine")):
        shutil.rmtree(d, ignore_errors=True)
    for f in files:
        os.makedirs(os.path.dirname(os.path.join(tree, f)), exist_ok=True)
        shutil.copy2(os.path.join(SRC, f), os.path.join(tree, f))
    if data and os.path.isdir(data):
        shutil.copytree(data, os.path.join(tree, "data"), ignore=shutil.ignore_patterns("austen"))
    py = os.environ.get("REF_PYTHON", "/usr/bin/python3")
    # only what the tests run (not `make all`: the benchmarks and the man page are never mutated)
    for cmd in (["autoreconf", "-fi"], ["./configure", "--without-cuda", f"REF_PYTHON={py}"],
                ["make", "-j2"] + all_targets()):
        if sh(cmd, tree, log) != 0:
            sys.exit(f"mutants: `{' '.join(cmd)}` failed in {tree}: see {log}")
    for mod in MODULES.values():
        for f in mod[0]:
            o = object_of(tree, f)
            os.makedirs(os.path.join(work, "pristine", os.path.dirname(f)), exist_ok=True)
            shutil.copy2(o, os.path.join(work, "pristine", f + ".o"))
    with open(stamp_file, "w") as s:
        s.write(stamp)
    return tree


def object_of(tree, f):
    base, d = os.path.splitext(os.path.basename(f))[0], os.path.join(tree, os.path.dirname(f))
    for name in (base + ".o", "libdtrain_a-" + base + ".o"):
        if os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    sys.exit(f"mutants: no object file for {f} in {d}")


def restore(work, tree, f, text, st):
    """The original source with its old time stamp, its original object, and no archive (rebuilt
    from the objects by the next make), so the next build is a pristine tree plus one mutant."""
    path = os.path.join(tree, f)
    with open(path, "w") as out:
        out.write(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    shutil.copy2(os.path.join(work, "pristine", f + ".o"), object_of(tree, f))
    for lib in ("libdtrain.a",):
        if os.path.exists(os.path.join(tree, lib)):
            os.remove(os.path.join(tree, lib))


# ---- running mutants ----------------------------------------------------------------------

def test_env(tree):
    env = dict(os.environ, top_srcdir=tree, top_builddir=tree, MPIRUN="mpirun",
               REF_PYTHON=os.environ.get("REF_PYTHON", "/usr/bin/python3"))
    env.pop("MAKEFLAGS", None)
    env.pop("MFLAGS", None)
    return env


def run_tests(tree, tests, log):
    """(status, test): the first test that fails kills the mutant."""
    for kind, name, _ in tests:
        cmd = [os.path.join(tree, name), "--jobs=1"] if kind == "crit" else ["bash", os.path.join(tree, name)]
        rc = sh(cmd, tree, log, timeout=TIME_LIMIT[kind], env=test_env(tree))
        if rc is None:
            return "timeout", name
        if rc not in (0, 77):
            return "killed", name
    return "survived", ""


def run_one(work, tree, mod, m, log):
    files, tests = MODULES[mod]
    path = os.path.join(tree, m["file"])
    text, st = open(path).read(), os.stat(path)
    lines = text.split("\n")
    old = lines[m["line"] - 1]
    assert old.strip() == m["old"], (m, old)
    lines[m["line"] - 1] = old[: len(old) - len(old.lstrip())] + m["new"]
    t0 = time.time()
    try:
        with open(path, "w") as out:
            out.write("\n".join(lines))
        targets = sorted({t for _, _, ts in tests for t in ts})
        if sh(["make", "-j2"] + targets, tree, log, timeout=900) != 0:
            status, test = "invalid", ""
        else:
            status, test = run_tests(tree, tests, log)
    finally:
        restore(work, tree, m["file"], text, st)
    return dict(m, module=mod, status=status, test=test, secs=round(time.time() - t0, 1))


def done_ids(results):
    if not os.path.exists(results):
        return set()
    return {json.loads(line)["id"] for line in open(results) if line.strip()}


def campaign(args, chosen):
    """Run the chosen mutants ({module: [mutant]}), appending to the results file; ids already in
    it are skipped, so an interrupted campaign continues where it stopped."""
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    import fcntl
    lock = open(os.path.join(work, "lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        sys.exit(f"mutants: another run holds {work}/lock")
    log = os.path.join(work, "build.log")
    tree = prepare(work, args.data, log)
    results = args.results or os.path.join(work, "results.jsonl")
    skip = done_ids(results)
    todo = [(mod, m) for mod, ms in chosen.items() for m in ms if m["id"] not in skip]
    print(f"mutants: {len(todo)} to run ({sum(map(len, chosen.values())) - len(todo)} already in {results}); "
          f"tree {tree}, test output in {work}/test.log", flush=True)
    rows = []
    for i, (mod, m) in enumerate(todo, 1):
        r = run_one(work, tree, mod, m, os.path.join(work, "test.log"))
        r["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
        rows.append(r)
        with open(results, "a") as out:
            out.write(json.dumps(r) + "\n")
        print(f"[{i}/{len(todo)}] {r['status']:9s} {r['secs']:6.1f}s {mod:10s} {m['id']} {m['file']}:{m['line']} "
              f"{m['op']}: {m['new']}" + (f"   ({r['test']})" if r["test"] else ""), flush=True)
    return results


# ---- reporting ----------------------------------------------------------------------------

def report(results_files, eq, generated=None):
    """Per-module table; returns the surviving mutants not listed as equivalent."""
    rows = {}
    for f in results_files:
        for line in open(f):
            if line.strip():
                r = json.loads(line)
                rows[r["id"]] = r
    mods = list(MODULES) + sorted({r["module"] for r in rows.values()} - set(MODULES))
    print(f"{'module':11s} {'generated':>9s} {'run':>5s} {'killed':>6s} {'(timeout)':>9s} {'survived':>8s} "
          f"{'equivalent':>10s} {'(accepted)':>10s} {'invalid':>7s} {'score':>7s}")
    live, tot = [], [0] * 8
    for mod in mods:
        rs = [r for r in rows.values() if r["module"] == mod]
        if not rs:
            continue
        killed = sum(r["status"] in ("killed", "timeout") for r in rs)
        tout = sum(r["status"] == "timeout" for r in rs)
        surv = [r for r in rs if r["status"] == "survived"]
        equiv = sum(r["id"] in eq and not accepted(eq[r["id"]]) for r in surv)
        acc = sum(r["id"] in eq and accepted(eq[r["id"]]) for r in surv)
        invalid = sum(r["status"] == "invalid" for r in rs)
        live += [r for r in surv if r["id"] not in eq]
        gen = len(generated[mod]) if generated and mod in generated else 0
        n = [gen, len(rs), killed, tout, len(surv), equiv, acc, invalid]
        tot = [a + b for a, b in zip(tot, n)]
        print(f"{mod:11s} {gen:9d} {len(rs):5d} {killed:6d} {tout:9d} {len(surv):8d} {equiv:10d} {acc:10d} "
              f"{invalid:7d} {score(killed, len(rs), invalid, equiv):>7s}")
    print(f"{'all':11s} {tot[0]:9d} {tot[1]:5d} {tot[2]:6d} {tot[3]:9d} {tot[4]:8d} {tot[5]:10d} {tot[6]:10d} "
          f"{tot[7]:7d} {score(tot[2], tot[1], tot[7], tot[5]):>7s}")
    print("score = killed / (run - invalid - equivalent); timeouts count as killed; accepted = survivors listed as "
          "not equivalent but\nnot killed here (reason in tests/mutants/equivalent.txt), counted against the score")
    return live


def accepted(reason):
    """A listed survivor that does change behaviour, where no test here can see it (the reason says why)."""
    return reason.startswith("accepted:")


def score(killed, n, invalid, equiv):
    d = n - invalid - equiv
    return f"{100.0 * killed / d:.1f}%" if d > 0 else "-"


def main():
    # stopping a run (also a background one, where the shell ignores SIGINT) puts the file back
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["list", "run", "check", "report"])
    ap.add_argument("files", nargs="*", help="results files (report)")
    ap.add_argument("-m", "--module", action="append", choices=list(MODULES), help="default: all modules")
    ap.add_argument("-n", type=int, default=10, help="mutants per module (run; default 10)")
    ap.add_argument("--all", action="store_true", help="every mutant of the modules (run)")
    ap.add_argument("--seed", type=int, default=1, help="sample seed (run)")
    ap.add_argument("--survivors", help="run: instead of a sample, the survivors (not equivalent) of this results file")
    ap.add_argument("--ids", help="run: instead of a sample, these mutants (comma-separated ids, listed ones too)")
    ap.add_argument("--work", default="build-mutants", help="scratch directory (default ./build-mutants)")
    ap.add_argument("--results", help="results file (default WORK/results.jsonl; check: WORK/check.jsonl)")
    ap.add_argument("--data", default=os.path.join(os.getcwd(), "data"),
                    help="token shards to copy into the scratch tree (default ./data)")
    args = ap.parse_args()
    mods = args.module or (CHECK_MODULES if args.command == "check" else list(MODULES))
    gen = all_mutants(mods)
    eq = load_equivalent()
    if args.command == "list":
        for mod, ms in gen.items():
            for m in ms:
                print(f"{m['id']} {mod:10s} {m['file']}:{m['line']}:{m['col']} {m['op']:10s} {m['new']}"
                      + ("   [equivalent]" if m["id"] in eq else ""))
        return 0
    if args.command == "report":
        live = report(args.files, eq, gen)
        for r in live:
            print(f"survived: {r['id']} {r['module']} {r['file']}:{r['line']} {r['op']}: {r['new']}")
        return 0
    if args.command == "check":
        # drawn from every mutant, so listing one changes nothing else in the sample; the listed
        # ones are skipped (they would run every test and prove nothing)
        TIME_LIMIT["sh"] = CHECK_SH_LIMIT
        chosen = {mod: [m for m in sample(ms, CHECK_PER_MODULE, CHECK_SEED) if m["id"] not in eq]
                  for mod, ms in gen.items()}
        args.results = args.results or os.path.join(os.path.abspath(args.work), "check.jsonl")
        if os.path.exists(args.results):
            os.remove(args.results)  # the check always runs its whole sample
    elif args.ids:
        want = set(args.ids.split(","))
        chosen = {mod: [m for m in ms if m["id"] in want] for mod, ms in gen.items()}
    elif args.survivors:
        again = {r["id"] for r in map(json.loads, open(args.survivors)) if r["status"] == "survived" and r["id"] not in eq}
        chosen = {mod: [m for m in ms if m["id"] in again] for mod, ms in gen.items()}
    else:
        chosen = {mod: sample(ms, None if args.all else args.n, args.seed) for mod, ms in gen.items()}
    t0 = time.time()
    results = campaign(args, chosen)
    print(f"mutants: {time.time() - t0:.0f} s")
    live = [r for r in report([results], eq, gen) if r["id"] in {m["id"] for ms in chosen.values() for m in ms}]
    for r in live:
        print(f"SURVIVED: {r['id']} {r['module']} {r['file']}:{r['line']} {r['op']}: {r['new']} "
              f"(not in tests/mutants/equivalent.txt)")
    if args.command == "check" and live:
        print(f"check-mutants: FAIL: {len(live)} mutants of the fixed sample survived")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
