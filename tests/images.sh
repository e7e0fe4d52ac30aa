#!/usr/bin/env bash
# Image sets (src/data/images.c, issue #25) against numpy (tests/ref/ref_images.py): the real
# Fashion-MNIST from Debian's dataset-fashion-mnist (gzip IDX; train with 2-pixel crops and flips
# on a batch that crosses the epoch boundary, t10k without), and CIFAR-10 batch files written here
# by numpy (two files, 4-pixel crops and flips, a batch across the epoch boundary); then files that
# must be refused with a message naming them.
source "$top_srcdir/tests/lib.sh"
t=$(tmpdir)
trap 'rm -rf "$t"' EXIT
DUMP="$top_builddir/tests/images_dump"
REF="$top_srcdir/tests/ref/ref_images.py"
need_fmnist
run "$DUMP" "$t/d.bin" idx "$F/train-images-idx3-ubyte.gz" "$F/train-labels-idx1-ubyte.gz" 5 2 1 59990 64
run "$PY" "$REF" "$t/d.bin" idx "$F/train-images-idx3-ubyte.gz" "$F/train-labels-idx1-ubyte.gz" 2 1 59990
run "$DUMP" "$t/d.bin" idx "$F/t10k-images-idx3-ubyte.gz" "$F/t10k-labels-idx1-ubyte.gz" 9 0 0 100 32
run "$PY" "$REF" "$t/d.bin" idx "$F/t10k-images-idx3-ubyte.gz" "$F/t10k-labels-idx1-ubyte.gz" 0 0 100
"$PY" - "$t" <<'PY'
import numpy as np, sys
r = np.random.default_rng(3)
for i, n in ((1, 37), (2, 50)):
    rec = r.integers(0, 256, size=(n, 3073), dtype=np.uint8)
    rec[:, 0] = r.integers(0, 10, size=n)
    rec.tofile(f"{sys.argv[1]}/data_batch_{i}.bin")
rec[0, 0] = 12
rec.tofile(f"{sys.argv[1]}/bad_label.bin")
PY
run "$DUMP" "$t/d.bin" cifar "$t/data_batch_*.bin" 11 4 1 80 20
run "$PY" "$REF" "$t/d.bin" cifar "$t/data_batch_1.bin" "$t/data_batch_2.bin" 4 1 80
# refused, with the file named
refuse() { # refuse WANT ARGS...: images_dump must exit 1 with WANT in its message
  local want=$1 out
  shift
  if out=$("$DUMP" "$t/e.bin" "$@" 1 0 0 0 1 2>&1); then echo "FAIL: accepted: $*"; exit 1; fi
  grep -qF -- "$want" <<< "$out" || { echo "FAIL: '$out' does not say '$want'"; exit 1; }
  echo "ok: refused: $out"
}
gunzip -c "$F/t10k-images-idx3-ubyte.gz" > "$t/full-images"
head -c 100000 "$t/full-images" > "$t/short-images"
refuse "$t/none: cannot open" idx "$t/none" "$F/t10k-labels-idx1-ubyte.gz"
refuse "$F/t10k-labels-idx1-ubyte.gz: not an IDX images file (magic 0x00000801" idx "$F/t10k-labels-idx1-ubyte.gz" \
  "$F/t10k-labels-idx1-ubyte.gz"
refuse "$t/short-images: 100000 bytes, but its header says 10000 images of 28x28" idx "$t/short-images" \
  "$F/t10k-labels-idx1-ubyte.gz"
refuse "$F/train-labels-idx1-ubyte.gz: not the IDX labels of the 10000 images" idx "$F/t10k-images-idx3-ubyte.gz" \
  "$F/train-labels-idx1-ubyte.gz"
refuse "$t/bad_label.bin: label 12 of record 0 is not below model.classes = 10" cifar "$t/bad_label.bin"
head -c 5000 "$t/data_batch_1.bin" > "$t/cut.bin"
refuse "$t/cut.bin: 5000 bytes is not a whole number of CIFAR-10 records" cifar "$t/cut.bin"
refuse "$t/nothing_*.bin: no CIFAR-10 batch file matches" cifar "$t/nothing_*.bin"
echo "images: OK"
