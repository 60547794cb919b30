#!/usr/bin/env python3
"""Tokenize strings with llama.cpp's own tokenizer (llama-cpp-python, vocab only) and print JSON.

Usage:
    llama_cpp_tokenize.py STRINGS.json NAME=MODEL.gguf [NAME=MODEL.gguf ...]

For each model it prints, under its NAME:
  ids          token ids of each string (no BOS, special tokens in the text parsed: llama.cpp's
               `special=True`, the same as the Rust `encode(s, false)`)
  ids_special  token ids with add_bos=True (what `encode(s, true)` must give)
  n_vocab      the vocabulary size
  pieces_sha256  sha256 over the bytes of every token (llama_token_to_piece, special=True),
               each prefixed by its length as 4 little-endian bytes
The output of one run over the reference models is committed as tests/data/upstream_llama_cpp.json;
to regenerate it (from the crate directory, with llama-cpp-python installed):
    M=${SPEC_MODELS_DIR:-$HOME/.cache/spec-decode/models}
    python3 tests/upstream/llama_cpp_tokenize.py tests/data/strings.json \
        smollm2-135m=$M/smollm2-135m.gguf qwen2.5-coder-0.5b=$M/qwen2.5-coder-0.5b.gguf \
        > tests/data/upstream_llama_cpp.json
"""

import hashlib
import json
import sys


def token_to_piece(llama_cpp, llm, token: int) -> bytes:
    """llama_token_to_piece with special=True and a buffer large enough for any token.

    (llama-cpp-python's own detokenize uses a 32-byte buffer and yields b"" for longer tokens.)
    """
    import ctypes

    size = 64
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_token_to_piece(llm._model.vocab, token, buf, size, 0, True)
        if n >= 0:
            return buf.raw[:n]
        size = -n


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    import llama_cpp  # imported late so --help works without it

    with open(sys.argv[1], encoding="utf-8") as f:
        strings = json.load(f)
    out = {
        "upstream": f"llama-cpp-python {llama_cpp.__version__}",
        "strings": strings,
        "models": {},
    }
    for arg in sys.argv[2:]:
        name, _, path = arg.partition("=")
        llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        ids = [llm.tokenize(s.encode("utf-8"), add_bos=False, special=True) for s in strings]
        ids_special = [llm.tokenize(s.encode("utf-8"), add_bos=True, special=True) for s in strings]
        n_vocab = llm.n_vocab()
        h = hashlib.sha256()
        for i in range(n_vocab):
            piece = token_to_piece(llama_cpp, llm, i)
            h.update(len(piece).to_bytes(4, "little"))
            h.update(piece)
        out["models"][name] = {
            "n_vocab": n_vocab,
            "pieces_sha256": h.hexdigest(),
            "ids": ids,
            "ids_special": ids_special,
        }
    json.dump(out, sys.stdout, ensure_ascii=False)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
