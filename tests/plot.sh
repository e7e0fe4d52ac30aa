#!/usr/bin/env bash
# dtrain plot: a real run's metrics become an SVG picture that parses as XML, has the five panels
# with their axis names (with --peak-tflops the FLOP-rate panel is MFU, its values gflops / peak), one line per series with one point per logged step (validation loss as
# markers on its own steps), a second run overlaid with its own legend entry, and a resumed run's
# step going back starts a new line. Bad input: one line naming the file and line, exit 2, no
# picture or temporary left behind.
source "$top_srcdir/tests/lib.sh"
begin_test
fail() { echo "FAIL: $*"; exit 1; }
run "$DTRAIN" "$cfg" train.steps=12 train.eval_every=4 log.every=1 log.metrics="$t/a.jsonl" checkpoint.dir="$t/ck" > /dev/null
run "$DTRAIN" "$cfg" train.steps=12 train.eval_every=4 log.every=1 train.lr=3e-3 log.metrics="$t/b.jsonl" \
  checkpoint.dir="$t/ck2" > /dev/null
run "$DTRAIN" plot "$t/a.jsonl" || fail "plot of one run"
[ -s "$t/a.svg" ] || fail "no $t/a.svg (the default name)"
run "$DTRAIN" plot -o "$t/ab.svg" "$t/a.jsonl" "$t/b.jsonl" || fail "plot of two runs"
run "$DTRAIN" plot --peak-tflops 0.5 -o "$t/mfu.svg" "$t/a.jsonl" || fail "plot with --peak-tflops"
# a resumed run appends steps 7..12 again after 12: the metrics go back, a second line starts
{ cat "$t/a.jsonl"; sed -n '7,12p' "$t/a.jsonl"; } > "$t/r.jsonl"
run "$DTRAIN" plot "$t/r.jsonl" -o "$t/r.svg" || fail "plot of a resumed run"
"$PY" - "$t" <<'PY' || fail "picture contents"
import sys, xml.etree.ElementTree as ET
ns = "{http://www.w3.org/2000/svg}"
def load(p):
    root = ET.parse(p).getroot()
    texts = [t.text or "" for t in root.iter(ns + "text")]
    lines = [len(pl.get("points").split()) for pl in root.iter(ns + "polyline")]
    return texts, lines, len(list(root.iter(ns + "circle")))
d = sys.argv[1]
texts, lines, dots = load(f"{d}/a.svg")
for want in ["loss (solid: train, dashed: validation)", "learning rate", "gradient norm (before clipping)",
             "throughput", "tokens", "step", "loss", "lr", "tokens/s", "a.jsonl",
             "model FLOP rate (6N + attention per token)", "GFLOP/s"]:
    assert want in texts, f"no text '{want}' in a.svg: {texts}"
# train loss, validation loss (3 evals), lr, grad norm, tokens/s, GFLOP/s
assert lines == [12, 3, 12, 12, 12, 12], f"polyline point counts {lines}"
# MFU: the same line scaled by 1 / (1e3 x 0.5): the panel's tick labels span gflops / 500
import json
gf = [json.loads(l)["gflops"] for l in open(f"{d}/a.jsonl")]
texts_m, lines_m, _ = load(f"{d}/mfu.svg")
assert "model FLOP utilisation (of a 0.5 TFLOP/s peak)" in texts_m and "MFU" in texts_m, texts_m
assert lines_m == lines, lines_m
num = lambda ts: {x for x in ts if x.replace(".", "", 1).replace("e-", "", 1).isdigit()}
new = [float(x) for x in num(texts_m) - num(texts)]  # the MFU axis's tick labels (the rest are a.svg's)
assert new and 0.4 * max(gf) / 500 <= max(new) <= 2.5 * max(gf) / 500, (new, max(gf) / 500)
assert dots == 3, f"{dots} validation markers, want 3"
texts, lines, dots = load(f"{d}/ab.svg")
assert "a.jsonl" in texts and "b.jsonl" in texts, texts
assert sorted(lines) == sorted([12, 3, 12, 12, 12, 12] * 2), lines
texts, lines, dots = load(f"{d}/r.svg")
assert lines == [12, 6, 3, 2, 12, 6, 12, 6, 12, 6, 12, 6], f"resumed run's lines {lines}"
print("pictures: OK")
PY
# bad input
printf '{"step": 1, "loss": 5.5}\n{"step": 2, "loss": 5.4}\n{"step": 3, "loss": [1]}\n' > "$t/bad.jsonl"
set +e
"$DTRAIN" plot "$t/bad.jsonl" > "$t/o" 2>&1; rc=$?
set -e
cat "$t/o"
[ $rc -eq 2 ] || fail "bad JSONL: exit $rc, want 2"
grep -q "dtrain plot: $t/bad.jsonl:3: nested objects and arrays are not metrics" "$t/o" || fail "message"
[ ! -e "$t/bad.svg" ] && [ ! -e "$t/bad.svg.tmp" ] || fail "a picture was left behind"
for args in "$t/none.jsonl" "-o $t/x.png $t/a.jsonl" "" "--bogus $t/a.jsonl" "--peak-tflops 0 $t/a.jsonl"; do
  set +e
  "$DTRAIN" plot $args > "$t/o" 2>&1; rc=$?
  set -e
  [ $rc -eq 2 ] || { cat "$t/o"; fail "plot $args: exit $rc, want 2"; }
  echo "ok: plot $args -> exit 2: $(head -1 "$t/o")"
done
grep -q "$t/none.jsonl" <("$DTRAIN" plot "$t/none.jsonl" 2>&1) || fail "missing file not named"
echo "plot: OK"
