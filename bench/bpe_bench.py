#!/usr/bin/env python3
"""GPT-2 tokeniser throughput: `dtrain prep --tokenizer gpt2` next to tiktoken on the same text in
the same run, 1 thread and then all cores, alternating engines within each repetition (a benchmark,
not a test).

    bench/bpe_bench.py [--dtrain ./dtrain] [--vocab data/gpt2] [--mb 64] [--reps 3] [--threads N]

Text: the bundled Austen novels (data/austen/*.txt, from scripts/get-data.sh) copied until --mb
megabytes, each copy of a novel one document (file). dtrain: the whole `dtrain prep` command
(its own summary time: reading, tokenising, writing and fsyncing the shards; the vocabulary load
excluded) and its CPU seconds (getrusage of the child). tiktoken 0.14 (Rust): Encoding built
offline from the same encoder.json with tiktoken's own GPT-2 pattern (equivalent to GPT-2's,
faster in its regex engine), encode_ordinary per document on 1 thread, encode_ordinary_batch
with num_threads = N for all cores; wall and process CPU time. MB = 10^6 bytes of text. Both
engines' token counts must agree. Prints the CPU model and the load average before and after:
on a shared machine other processes take cores, so compare the engines within one run.
"""
import argparse
import glob
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import bpe_ref  # noqa: E402  (the tests' offline tiktoken Encoding)
from tiktoken_ext.openai_public import r50k_pat_str  # noqa: E402  (tiktoken's GPT-2 pattern, no download)


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def run_dtrain(a, files, threads, out):
    for p in glob.glob(out + "_*.bin"):
        os.unlink(p)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run([a.dtrain, "prep", "--tokenizer", "gpt2", "--vocab", a.vocab, "--val-fraction", "0",
                          "--threads", str(threads), out] + files, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    m = re.search(r"-> (\d+) val \+ (\d+) train tokens .* in ([0-9.]+) s", res.stdout)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return int(m.group(1)) + int(m.group(2)), float(m.group(3)), wall, cpu


def run_tiktoken(E, texts, threads):
    t0, c0 = time.perf_counter(), time.process_time()
    if threads == 1:
        n = sum(len(E.encode_ordinary(t)) for t in texts)
    else:
        n = sum(map(len, E.encode_ordinary_batch(texts, num_threads=threads)))
    return n + len(texts), time.perf_counter() - t0, time.process_time() - c0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtrain", default="./dtrain")
    ap.add_argument("--vocab", default="data/gpt2")
    ap.add_argument("--novels", default="data/austen")
    ap.add_argument("--mb", type=float, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    novels = [open(p, "rb").read() for p in sorted(glob.glob(os.path.join(a.novels, "*.txt")))]
    if not novels:
        sys.exit(f"bpe_bench: no {a.novels}/*.txt: run scripts/get-data.sh first")
    E = bpe_ref.encoding(a.vocab, pat=r50k_pat_str)
    with tempfile.TemporaryDirectory(prefix="dtrain-bpe-bench.") as d:
        files, texts, total = [], [], 0
        while total < a.mb * 1e6:
            for b in novels:
                files.append(os.path.join(d, f"doc{len(files):04d}.txt"))
                open(files[-1], "wb").write(b)
                texts.append(b.decode("utf-8"))
                total += len(b)
        mb = total / 1e6
        print(f"# GPT-2 tokeniser throughput: {mb:.1f} MB of text in {len(files)} documents (Austen novels), "
              f"{a.reps} repetitions, medians; MB = 1e6 bytes")
        print(f"# CPU: {cpu_model()}, {os.cpu_count()} logical CPUs; load average before: "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"# dtrain: {a.dtrain} prep --tokenizer gpt2 (time of its summary line: read + tokenise + write shards);"
              f" tiktoken 0.14 encode_ordinary(_batch), tiktoken's GPT-2 pattern")
        rows = {}
        for rep in range(a.reps):
            for threads in (1, a.threads):
                n1, t_in, wall, cpu = run_dtrain(a, files, threads, os.path.join(d, "out"))
                rows.setdefault(("dtrain prep", threads), []).append((mb / t_in, mb / cpu, wall))
                n2, wall2, cpu2 = run_tiktoken(E, texts, threads)
                rows.setdefault(("tiktoken", threads), []).append((mb / wall2, mb / cpu2, wall2))
                if n1 != n2:
                    sys.exit(f"bpe_bench: token counts differ: dtrain {n1}, tiktoken {n2}")
        print(f"# both engines: {n1} tokens (<|endoftext|> per document included)")
        print(f"{'engine':12} {'threads':>7} {'MB/s':>8} {'MB/s/thr':>9} {'MB/cpu-s':>9}   runs (MB/s)")
        for (eng, thr), v in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            s = statistics.median(x[0] for x in v)
            print(f"{eng:12} {thr:7d} {s:8.2f} {s / thr:9.2f} {statistics.median(x[1] for x in v):9.2f}   "
                  + " ".join(f"{x[0]:.1f}" for x in v))
        for thr in (1, a.threads):
            r = statistics.median(x[0] for x in rows[("dtrain prep", thr)]) / statistics.median(
                x[0] for x in rows[("tiktoken", thr)])
            print(f"# {thr} thread(s): dtrain prep / tiktoken = {r:.2f}x")
        d1 = statistics.median(x[0] for x in rows[("dtrain prep", 1)])
        dn = statistics.median(x[0] for x in rows[("dtrain prep", a.threads)])
        print(f"# dtrain prep scaling 1 -> {a.threads} threads: {dn / d1:.2f}x")
        print(f"# load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
