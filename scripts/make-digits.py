#!/usr/bin/env python3
"""Converts scikit-learn's bundled copy of the UCI handwritten digits
(sklearn/datasets/data/digits.csv.gz: 1797 rows of 64 pixels in 0..16 and
a label) into corpora/datasets/digits/digits.safetensors, once.

    pip download scikit-learn --no-deps --only-binary=:all: -d /tmp/skl
    python3 scripts/make-digits.py /tmp/skl/scikit_learn-*.whl

Needs numpy and safetensors. The output holds `inputs` (1797, 1, 8, 8) u8
and `labels` (1797,) i64, with the source in the file's metadata.
"""
import gzip
import hashlib
import io
import sys
import zipfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

MEMBER = "sklearn/datasets/data/digits.csv.gz"


def main(wheel: str) -> None:
    with zipfile.ZipFile(wheel) as z:
        raw = gzip.decompress(z.read(MEMBER))
    table = np.loadtxt(io.BytesIO(raw), delimiter=",", dtype=np.int64)
    assert table.shape == (1797, 65), table.shape
    inputs = table[:, :64].astype(np.uint8).reshape(1797, 1, 8, 8)
    labels = np.ascontiguousarray(table[:, 64])
    out = Path(__file__).resolve().parent.parent / "corpora/datasets/digits/digits.safetensors"
    save_file(
        {"inputs": inputs, "labels": labels},
        str(out),
        metadata={
            "source": "UCI Optical Recognition of Handwritten Digits (test set), as bundled by scikit-learn",
            "classes": "10",
            "csv_sha256": hashlib.sha256(raw).hexdigest(),
        },
    )
    print(out, hashlib.sha256(out.read_bytes()).hexdigest())


if __name__ == "__main__":
    main(sys.argv[1])
