"""The GGUF tokenizer path against llama.cpp's own tokenizer test pairs.

llama.cpp ships tokenizer-only GGUFs (`models/ggml-vocab-*.gguf`) with inputs (`.inp`) and the
token ids the reference tokenizer gives (`.out`). They are not in any installed package, so this
is a benchmark-side check, not a test: it reads them from the llama-cpp-python *source* archive
that `pip download --no-deps --no-binary=:all: llama-cpp-python==0.3.36 -d bench/.work/src`
puts in bench/.work/src (the same archive the llama.cpp benchmark builds from); it never
downloads anything itself.

    .venv/bin/python bench/llm_vocab_pairs.py    → bench/results/llm_vocab_pairs.json
"""
from __future__ import annotations

import json
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARCHIVE = HERE / ".work" / "src" / "llama_cpp_python-0.3.36.tar.gz"
RESULTS = HERE / "results" / "llm_vocab_pairs.json"
VOCABS = ("llama-spm", "llama-bpe", "gpt-2", "qwen2", "phi-3", "falcon", "starcoder", "deepseek-llm", "command-r",
          "mpt", "refact", "gpt-neox", "baichuan", "deepseek-coder", "bert-bge")
SEP = "\n__ggml_vocab_test__\n"


def main() -> None:
    if not ARCHIVE.is_file():
        sys.exit(f"{ARCHIVE} is missing: pip download --no-deps --no-binary=:all: llama-cpp-python==0.3.36 -d {ARCHIVE.parent}")
    os.environ.setdefault("MODELEXPORT_CACHE_DIR", str(HERE / ".work" / "cache"))
    from modelexport.core.errors import ModelExportError
    from modelexport.llm.run.tokenizers import load_gguf_tokenizer

    out: dict = {"bench": "llm_vocab_pairs", "source": ARCHIVE.name, "vocabs": {}}
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(ARCHIVE) as tar:
        members = {m.name.split("/models/")[-1]: m for m in tar.getmembers() if "/vendor/llama.cpp/models/ggml-vocab-" in m.name}
        for v in VOCABS:
            names = [f"ggml-vocab-{v}.gguf", f"ggml-vocab-{v}.gguf.inp", f"ggml-vocab-{v}.gguf.out"]
            if not all(n in members for n in names):
                continue
            for n in names:
                tar.extract(members[n], tmp, filter="data")
            base = Path(tmp) / members[names[0]].name
            t0 = time.perf_counter()
            try:
                tok = load_gguf_tokenizer(base)
            except ModelExportError as e:
                out["vocabs"][v] = {"status": "unsupported", "reason": e.problem}
                continue
            # .inp: every input followed by SEP; .out: one line of ids per input (llama.cpp's test-tokenizer-0)
            inputs = Path(str(base) + ".inp").read_text(encoding="utf-8").split(SEP)[:-1]
            outputs = Path(str(base) + ".out").read_text(encoding="utf-8").split("\n")[:len(inputs)]
            ok, fails = 0, []
            for text, ids in zip(inputs, outputs):
                want = [int(x) for x in ids.split()]
                got = tok.encode(text, add_special_tokens=False)
                if got == want:
                    ok += 1
                elif len(fails) < 3:
                    fails.append({"text": text[:60], "want": want[:12], "got": got[:12]})
            out["vocabs"][v] = {"pairs": min(len(inputs), len(outputs)), "equal": ok, "examples_of_difference": fails,
                                "seconds": round(time.perf_counter() - t0, 2)}
            print(v, out["vocabs"][v]["equal"], "/", out["vocabs"][v]["pairs"], flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1, ensure_ascii=False))
    print("wrote", RESULTS)


if __name__ == "__main__":
    main()
