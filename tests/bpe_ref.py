"""The independent reference for dtrain's GPT-2 tokeniser (used by tests/bpe_tiktoken.sh and
bench/bpe_bench.sh): tiktoken, its Encoding built offline from the same encoder.json (ranks = ids,
bytes through GPT-2's byte-to-unicode table) with GPT-2's own pre-tokenisation pattern.

Text that is not valid UTF-8 cannot be a Python str for tiktoken. dtrain treats each byte that
does not start a well-formed sequence as one character outside \\p{L}, \\p{N}, \\s; here such bytes
become lone surrogates (surrogateescape, one per byte, category Cs: the same class), Python's
`regex` module (the engine of OpenAI's encoder.py) cuts the pre-tokens with the same pattern, and
tiktoken's BPE (_encode_single_piece) encodes each pre-token's original bytes.

  bpe_ref.py classes VOCAB CLASSES_FILE         dtrain's classes (tests/bpe_classes) vs tiktoken's
  bpe_ref.py corpus OUTDIR                      write the adversarial documents
  bpe_ref.py compare VOCAB PREFIX FILE...       shards PREFIX_{val,train}_*.bin vs the reference
  bpe_ref.py decoded DECODED FILE...            `dtrain prep --decode` output vs <|endoftext|> + files
"""
import glob
import json
import os
import random
import struct
import sys
import unicodedata

import regex
import tiktoken

GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = 50256


def byte_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def encoding(vocab, pat=GPT2_PAT):
    dec = {u: b for b, u in byte_to_unicode().items()}
    enc = json.load(open(os.path.join(vocab, "encoder.json"), encoding="utf-8"))
    ranks = {bytes(dec[c] for c in t): i for t, i in enc.items() if t != "<|endoftext|>"}
    assert enc["<|endoftext|>"] == EOT and len(ranks) == EOT
    return tiktoken.Encoding("gpt2-offline", pat_str=pat, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT})


PAT = regex.compile(GPT2_PAT)


def ref_tokens(E, data):
    """GPT-2 tokens of one document (bytes)."""
    try:
        return E.encode_ordinary(data.decode("utf-8"))
    except UnicodeDecodeError:
        pass
    out = []
    for piece in PAT.findall(data.decode("utf-8", "surrogateescape")):
        out += E._encode_single_piece(piece.encode("utf-8", "surrogateescape"))
    return out


def ref_tokens_regex(E, data):
    """The same through Python's regex for valid text too: checks the path above against tiktoken."""
    out = []
    for piece in PAT.findall(data.decode("utf-8", "surrogateescape")):
        out += E._encode_single_piece(piece.encode("utf-8", "surrogateescape"))
    return out


def shard_tokens(prefix, split):
    toks, n_shards = [], 0
    for p in sorted(glob.glob(f"{prefix}_{split}_*.bin")):
        data = open(p, "rb").read()
        magic, version, n = struct.unpack("<3i", data[:12])
        assert magic == 20240520 and version == 1 and len(data) == 1024 + 2 * n, f"{p}: bad shard"
        toks += struct.unpack(f"<{n}H", data[1024:])
        n_shards += 1
    return toks, n_shards


def cmd_classes(vocab, path):
    cps = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    bytes_only = {bytes([b]): b for b in range(256)}
    ours = {"L": set(), "N": set(), "S": set()}
    for line in open(path):
        k, lo, hi = line.split()
        ours[k].update(range(int(lo, 16), int(hi, 16) + 1))
    bad = 0
    for k, pat in (("L", r"\p{L}+"), ("N", r"\p{N}+"), ("S", r"\s+")):
        E = tiktoken.Encoding("probe", pat_str=pat, mergeable_ranks=bytes_only, special_tokens={})
        theirs = set(map(ord, E.decode_bytes(E.encode_ordinary(cps)).decode("utf-8")))
        diff = sorted(ours[k] ^ theirs)
        bad += len(diff)
        print(f"class {pat:8} dtrain {len(ours[k]):6} code points, tiktoken {len(theirs):6}, differing {len(diff)}"
              + (f" (first U+{diff[0]:04X})" if diff else ""))
    # Python's stdlib unicodedata (an older Unicode): every code point it assigns must agree.
    old = [c for c in range(0x110000) if unicodedata.category(chr(c)) != "Cn"]
    def ln(c):
        return "L" if c in ours["L"] else "N" if c in ours["N"] else "-"
    dis = [c for c in old if ln(c) != {"L": "L", "N": "N"}.get(unicodedata.category(chr(c))[0], "-")]
    print(f"unicodedata {unicodedata.unidata_version}: {len(old)} assigned code points, class L/N differs for {len(dis)}")
    return 1 if bad or dis else 0


def words(rng, pool, n, seps):
    return "".join(rng.choice(seps) + "".join(rng.choice(pool) for _ in range(rng.randint(1, 8))) for _ in range(n))


def cmd_corpus(out):
    rng = random.Random(23)
    os.makedirs(out, exist_ok=True)
    by_cat = {}
    for c in range(0x110000):
        by_cat.setdefault(unicodedata.category(chr(c)), []).append(chr(c))
    letters = [c for k, v in by_cat.items() if k[0] == "L" for c in v]
    numbers = [c for k, v in by_cat.items() if k[0] == "N" for c in v]
    marks = [c for k, v in by_cat.items() if k[0] == "M" for c in v]
    symbols = [c for k, v in by_cat.items() if k[0] in "PS" for c in v]
    unassigned = by_cat["Cn"] + by_cat["Co"]
    ws = [" ", "\t", "\n", "\r", "\x0b", "\x0c", "\x85", "\xa0", "\u1680", "\u2000", "\u2005", "\u200a", "\u2028",
          "\u2029", "\u202f", "\u205f", "\u3000", "\x1c", "\x1f", "\u200b", "\u180e", "\ufeff"]
    docs = {}
    scripts = ["LATIN", "GREEK", "CYRILLIC", "ARMENIAN", "HEBREW", "ARABIC", "SYRIAC", "THAANA", "NKO", "DEVANAGARI",
               "BENGALI", "GURMUKHI", "GUJARATI", "TAMIL", "TELUGU", "KANNADA", "MALAYALAM", "SINHALA", "THAI", "LAO",
               "TIBETAN", "MYANMAR", "GEORGIAN", "HANGUL", "ETHIOPIC", "CHEROKEE", "CANADIAN", "OGHAM", "RUNIC",
               "KHMER", "MONGOLIAN", "HIRAGANA", "KATAKANA", "CJK UNIFIED", "YI ", "LINEAR B", "GOTHIC", "DESERET",
               "CUNEIFORM", "EGYPTIAN HIEROGLYPH", "MATHEMATICAL", "TANGUT", "ADLAM", "OSAGE", "BRAHMI"]
    named = {s: [] for s in scripts}
    for c in letters + numbers + marks:
        name = unicodedata.name(c, "")
        for s in scripts:
            if name.startswith(s):
                named[s].append(c)
    docs["scripts.txt"] = "\n".join(f"{s}: " + words(rng, named[s], 60, [" ", " ", ", ", "\n", "  ", "."])
                                    for s in scripts if named[s])
    docs["unicode_random.txt"] = words(rng, letters + numbers + marks + symbols + unassigned + ws, 4000, [" ", ""])
    docs["numbers.txt"] = words(rng, numbers, 800, [" ", "", ".", ",", " x"]) + " 3.14 1,000,000 ½ ² Ⅻ ٣٤٥ ४२"
    emoji = ["😀", "👍🏽", "👩‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷🇩🇪", "1️⃣", "❤️", "🤷‍♀️", "🧑🏿‍🚀", "©", "™", "🀄", "🫠"]
    docs["emoji.txt"] = "".join(rng.choice(emoji + [" ", "a", "\n", "!", "  "]) for _ in range(3000))
    docs["whitespace.txt"] = "".join(rng.choice(ws + ["a", "b", "7", "!", "'s", " x"]) for _ in range(6000)) + "  \n\t "
    docs["whitespace_only.txt"] = "".join(rng.choice(ws) for _ in range(500))
    con = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ll", "''", "'", "’s", "it", "s", "re",
           " ", "  ", "\n", "x", "7", "!", "rock'n'roll", "'''s"]
    docs["contractions.txt"] = "".join(rng.choice(con) for _ in range(5000)) + " don't'"
    docs["digits.txt"] = "".join(rng.choice(["0", "12", "345", " ", "\n", ".", "a", "1e9", "-"]) for _ in range(5000))
    docs["long_pieces.txt"] = (" " * 3000 + "x" + "ab" * 2000 + " " + "7" * 3000 + "!" * 2500 + "\n" * 1500 +
                               "".join(rng.choice("QWERTYuiop") for _ in range(3000)) + " " * 700)
    docs["eot_literal.txt"] = "<|endoftext|> a<|endoftext|>b\n<|endoftext|>"
    docs["crlf.txt"] = "It is a truth universally acknowledged,\r\nthat a single man\r\n\r\n  in possession\r\n"
    docs["no_newline_at_end.txt"] = "The end"
    docs["newlines_only.txt"] = "\n\n\n"
    frag = ["a", "Zz", "7", "42", " ", "  ", "\n", "\n\n", "\t", "'", "'s", "'re", "'ll", "'S", "!", "?!", ".", "é",
            "中", "😀", "\xa0", "\u3000", "Ⅳ", "\u0301", "\x1c", "\r\n", "٣", "the", " the", "The", " and", "ing"]
    docs["fragments.txt"] = "".join(rng.choice(frag) for _ in range(400000))
    for name, text in docs.items():
        open(os.path.join(out, name), "wb").write(text.encode("utf-8"))
    # Not UTF-8: random bytes, each kind of ill-formed sequence, and invalid bytes inside text.
    bad = [b"\xff", b"\xfe", b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80",
           b"\xf4\x90\x80\x80", b"\xf5\x80", b"\xe4\xb8", b"\xf0\x9f\x98", b"\xc3", b"\xc3\xa9", b"\xe4\xb8\xad"]
    good = [b"a", b"the", b" ", b"  ", b"\n", b"'s", b"7", b"!", b"\xc2\xa0", b"\xe3\x80\x80", b" x", b"\t"]
    open(os.path.join(out, "invalid_utf8.bin"), "wb").write(b"".join(rng.choice(bad + good) for _ in range(20000)))
    open(os.path.join(out, "random_bytes.bin"), "wb").write(bytes(rng.randrange(256) for _ in range(30000)))
    open(os.path.join(out, "invalid_edges.bin"), "wb").write(b"\x80start \xff\xfe end\xe4\xb8")
    open(os.path.join(out, "empty.txt"), "wb").close()
    return 0


def cmd_compare(vocab, prefix, files):
    E = encoding(vocab)
    want, n_bytes, bad_docs = [], 0, 0
    for f in files:
        data = open(f, "rb").read()
        toks = ref_tokens(E, data)
        try:  # valid text without code points newer than Python's unicodedata (regex knows a newer Unicode)
            text = data.decode("utf-8")
            if all(unicodedata.category(c) != "Cn" for c in set(text)) and ref_tokens_regex(E, data) != toks:
                print(f"the reference's two paths disagree on {f}")
                bad_docs += 1
        except UnicodeDecodeError:
            pass
        want += [EOT] + toks
        n_bytes += len(data)
    val, nv = shard_tokens(prefix, "val")
    train, nt = shard_tokens(prefix, "train")
    got = val + train
    same = sum(a == b for a, b in zip(got, want))
    print(f"{prefix}: {len(files)} documents, {n_bytes} bytes; dtrain {len(val)} val ({nv} shards) + {len(train)} "
          f"train ({nt} shards) = {len(got)} tokens, reference {len(want)}; equal at {same} positions")
    if got != want:
        i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        print(f"FIRST DIFFERENCE at token {i}: dtrain {got[i:i + 8]} reference {want[i:i + 8]}")
        return 1
    return 1 if bad_docs or not val else 0


def cmd_decoded(decoded, files):
    want = b"".join(b"<|endoftext|>" + open(f, "rb").read() for f in files)
    got = open(decoded, "rb").read()
    print(f"decode(encode(x)): {len(got)} bytes decoded, {len(want)} expected, identical: {got == want}")
    return 0 if got == want else 1


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    sys.exit({"classes": lambda: cmd_classes(*args), "corpus": lambda: cmd_corpus(*args),
              "compare": lambda: cmd_compare(args[0], args[1], args[2:]),
              "decoded": lambda: cmd_decoded(args[0], args[1:])}[cmd]())
