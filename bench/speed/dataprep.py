"""Token preparation: throughput and bytes on disk per million tokens.

    python -m bench.speed.dataprep [--tokenizer gpt2] [--max_tokens N] [--out outputs/bench_dataprep]
                                   [--results DIR] [--smoke]

Tokenizes the bundled corpus into a fresh cache (the path every run takes: documents -> token stream written
to disk as it is tokenized), back to back, each in its own process: data.num_proc 1 and 2 with the Rust
tokenizer on one thread each (TOKENIZERS_PARALLELISM=false), and num_proc 1 with the tokenizer's own threads
on every core (true). Then the same corpus as a Hugging Face dataset (``save_to_disk``, read as
``hf:<folder>``, offline), which goes through ``Dataset.map(num_proc=...)``: num_proc 1 and 2, one thread each.
Reports tokens per second of the stream, the stream's bytes per million tokens (uint16) beside what the
int32 cache before it took, and the process's peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common.cli import check_flags, run_cli
from progressive.config import DataConfig
from progressive.data import build_tokenizer
from progressive.data.sources import read_documents, source_identity
from progressive.data.text import cached_stream

ROOT = Path(__file__).resolve().parents[2]


def _worker(tokenizer: str, max_tokens: int | None, num_proc: int, dataset: str = "bundled") -> None:
    """Tokenize ``dataset`` (the bundled corpus, or an hf: folder of it) into a new cache; print one JSON line."""

    with tempfile.TemporaryDirectory() as cache:
        cfg = DataConfig(dataset=dataset, tokenizer=tokenizer, cache_dir=cache, max_tokens=max_tokens,
                         num_proc=num_proc)
        tok = build_tokenizer(DataConfig(tokenizer=tokenizer, cache_dir=str(ROOT / ".cache" / "data")))
        src = source_identity(cfg)
        t0 = time.perf_counter()
        stream = cached_stream(cfg, tok, "train", max_tokens, src)
        seconds = time.perf_counter() - t0
        size = next(p for p in (Path(cache) / "tokens").iterdir() if p.suffix in (".u16", ".u32")).stat().st_size
    print(json.dumps({"tokens": len(stream), "seconds": seconds, "bytes": size, "dtype": str(stream.dtype),
                      "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def main(argv: list[str] | None = None) -> None:
    """The bench's command line (``argv``: sys.argv[1:] by default; ``--worker ...``: one measured process).

    Raises:
        ValueError: --max_tokens < 1, before any work.
    """
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        _worker(argv[1], None if argv[2] == "none" else int(argv[2]), int(argv[3]), *argv[4:5])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", default="gpt2", help="gpt2 (bundled files), bpe, wordpiece, or a local folder")
    ap.add_argument("--max_tokens", type=int, default=None, help="cap the stream (default: the whole corpus)")
    ap.add_argument("--out", default="outputs/bench_dataprep")
    ap.add_argument("--results", default=None, help="also record the results here (bench/results)")
    ap.add_argument("--smoke", action="store_true", help="20k tokens: check the script runs (numbers mean nothing)")
    args = ap.parse_args(argv)
    check_flags({"--max_tokens": args.max_tokens}, at_least_one=["--max_tokens"])
    # lazy: bench.lib.runs imports the trainer (torch, transformers' models), which neither the workers nor the
    # tokenizing processes they spawn (each imports this module as its main) need: 3 s of start-up each
    from bench.lib.runs import output_folder, publish

    if args.smoke:
        args.max_tokens = 20_000
    out = output_folder(args.out, "python -m bench.speed.dataprep", ["dataprep.*"])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        hub = _as_hf_dataset(Path(tmp) / "corpus", 4 if args.smoke else None)
        cases = [("bundled", 1, "false", args.max_tokens), ("bundled", 2, "false", args.max_tokens),
                 ("bundled", 1, "true", args.max_tokens), (f"hf:{hub}", 1, "false", None),
                 (f"hf:{hub}", 2, "false", None)]
        for source, num_proc, parallel, cap in cases:
            env = {**os.environ, "TOKENIZERS_PARALLELISM": parallel}
            proc = subprocess.run([sys.executable, "-m", "bench.speed.dataprep", "--worker", args.tokenizer,
                                   str(cap or "none"), str(num_proc), source], capture_output=True, text=True,
                                  env=env, cwd=ROOT)
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"error: the worker failed (exit {proc.returncode})")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append({"source": "bundled files" if source == "bundled" else "hf: save_to_disk (Dataset.map)",
                         "data.num_proc": num_proc,
                         "tokenizer threads": "1 per process" if parallel == "false" else f"all ({os.cpu_count()})",
                         "tokens": r["tokens"], "seconds": round(r["seconds"], 2),
                         "tokens/s": round(r["tokens"] / r["seconds"]),
                         "MB per 1M tokens (uint16)": round(r["bytes"] / r["tokens"] * 1e6 / 1e6, 3),
                         "MB per 1M tokens (int32, before)": 4.0, "dtype": r["dtype"],
                         "peak RSS MB": round(r["max_rss_mb"], 1)})
    payload = {"tokenizer": args.tokenizer, "results": rows,
               "command": " ".join(["python -m bench.speed.dataprep", *sys.argv[1:]])}
    text = publish(out, "dataprep", payload, args.results, "python -m bench.speed.dataprep")
    print(text)


def _as_hf_dataset(folder: Path, docs: int | None) -> Path:
    """The bundled corpus's documents (the first ``docs``, or all) as a datasets.save_to_disk folder with a
    train and a validation split, the way a Hub dataset arrives offline."""
    import datasets

    texts = [t for _, t in read_documents(DataConfig(dataset="bundled"))][:docs]
    cut = max(1, len(texts) // 50)
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": texts[cut:]}),
                          "validation": datasets.Dataset.from_dict({"text": texts[:cut]})}).save_to_disk(str(folder))
    return folder


if __name__ == "__main__":
    raise SystemExit(run_cli(main))  # a user's error is one line (exit 2); --debug shows the traceback
