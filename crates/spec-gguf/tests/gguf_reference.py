#!/usr/bin/env python3
"""Reference dequantization with the Python `gguf` package, for tests/python_reference.rs.

Usage: gguf_reference.py MODEL.gguf < requests
Request lines (values are written to OUT as raw little-endian float32):
  name TENSOR_NAME N_ROWS OUT
      the first N_ROWS rows (a row is the innermost GGUF dimension) of the tensor, located with
      gguf.GGUFReader: an independent check of the tensor table as well as of the decoding;
  raw GGML_TYPE ABS_OFFSET N_ROWS ROW_BYTES OUT
      N_ROWS rows of ROW_BYTES bytes read at ABS_OFFSET, decoded as GGML_TYPE (e.g. Q4_K). This
      skips GGUFReader, which takes tens of seconds on a 150k-token vocabulary.
Every request is decoded with gguf.quants.dequantize. Prints one "ok" line per request.
"""

import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize


def main() -> int:
    path = sys.argv[1]
    tensors = None
    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "name":
            _, name, n_rows, out_path = parts
            if tensors is None:
                tensors = {t.name: t for t in GGUFReader(path).tensors}
            t = tensors[name]
            data = np.asarray(t.data)
            # Quantized data comes as (rows..., bytes per row) uint8, plain data in its own dtype
            # and element shape; either way the last axis is one row.
            rows = data.reshape(-1, data.shape[-1])[: int(n_rows)]
            qtype = t.tensor_type
        elif parts[0] == "raw":
            _, type_name, offset, n_rows, row_bytes, out_path = parts
            qtype = GGMLQuantizationType[type_name]
            count = int(n_rows) * int(row_bytes)
            raw = np.fromfile(path, dtype=np.uint8, count=count, offset=int(offset))
            assert raw.size == count, "short read"
            rows = raw.reshape(int(n_rows), int(row_bytes))
        else:
            raise ValueError(f"bad request: {line!r}")
        values = dequantize(rows, qtype).astype("<f4", copy=False)
        values.tofile(out_path)
        print(f"ok {parts[1]} {values.size}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
