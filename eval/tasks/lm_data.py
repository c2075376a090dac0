"""Documents of the zero-shot LM tasks, read from the bundled files in data/ (see data/SOURCES.md).

Each loader returns plain strings, exactly what gets scored (before any detokenization):

- LAMBADA (OpenAI version, 5,153 passages): one passage per example; the last space-separated word is
  the target (split in ``eval.tasks.scoring.lambada_request``).
- WikiText-2 / WikiText-103 test (tokenized v1 files): one *page* per document. A page starts at a
  level-1 heading line `` = Title = `` and runs up to the next one; its lines are joined with "\\n".
  This is the page rule of the EleutherAI/wikitext_document_level dataset that lm-evaluation-harness's
  ``wikitext`` task reads, so our pages equal that dataset's ``wikitext-2-v1`` / ``wikitext-103-v1``
  (tokenized) configs. The harness task itself reads ``wikitext-2-raw-v1``: the same pages *without*
  ``<unk>`` (the raw text keeps the rare words). Offline we only have the tokenized files, so a model
  here also scores the literal string "<unk>"; numbers are therefore not identical to the harness's
  ``wikitext`` on the raw pages (online: ``--harness_tasks wikitext``).
- PTB test (Mikolov's 10k-vocabulary version, no article boundaries): ONE document, the whole test
  stream, each sentence followed by "\\n" (the newline plays the role of ``<eos>``). Tokens are scored
  as they are in the file (lower case, ``<unk>``, ``N`` for numbers; no detokenization), so the word
  count is the standard PTB test count: words + one ``<eos>`` per sentence = 82,430.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path

from common.paths import DATA

DATA_DIR = DATA

# task name -> bundled file (relative to data/)
TASK_FILES: dict[str, str] = {
    "lambada": "lambada/lambada_test.jsonl.gz",
    "wikitext2": "wikitext-2/wiki.test.tokens.gz",
    "wikitext103": "wikitext-103/wiki.test.tokens.gz",
    "ptb": "ptb/ptb.test.txt.gz",
}


def data_file(task: str, data_dir: str | Path | None = None) -> Path:
    """Path of ``task``'s test file under ``data_dir`` (default: the bundled data/), checked to exist.

    Raises:
        KeyError: unknown task.
        FileNotFoundError: the file is missing (the message names the path).
    """
    if task not in TASK_FILES:
        raise KeyError(f"unknown zero-shot task {task!r}; choose from {', '.join(TASK_FILES)}")
    p = Path(data_dir or DATA_DIR) / TASK_FILES[task]
    if not p.is_file():
        raise FileNotFoundError(
            f"{task}: data file {p} not found. The bundled copy lives at data/{TASK_FILES[task]} "
            "(see data/SOURCES.md); restore it, or point --data_dir at a folder with the same layout."
        )
    return p


def _read_text(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", newline="") as f:
        return f.read()


def load_lambada(data_dir: str | Path | None = None, limit: int | None = None) -> list[str]:
    """LAMBADA passages (``{"text": ...}`` per JSON line), the first ``limit`` if given."""
    p = data_file("lambada", data_dir)
    texts = [json.loads(line)["text"] for line in _read_text(p).splitlines() if line.strip()]
    return texts[:limit] if limit is not None else texts


def split_wikitext_pages(text: str) -> list[str]:
    """Split a WikiText file into pages at level-1 headings (`` = Title = ``; ``= = Sub = =`` is not one).

    The lines of a page are joined with "\\n"; a chunk with only whitespace before the first heading is
    dropped, the last page is kept whatever it holds (the document-level dataset's rule).
    """
    pages, lines = [], []
    for line in text.split("\n"):
        # Sub-headings read "= = X = =": fold them first so that only level-1 headings match.
        folded = line.replace("= = =", "===").replace("= =", "==").strip()
        if folded.startswith("= ") and folded.endswith(" ="):
            page = "\n".join(lines)
            if page.strip():
                pages.append(page)
            lines = []
        lines.append(line)
    pages.append("\n".join(lines))
    return pages


def load_wikitext(task: str, data_dir: str | Path | None = None, limit: int | None = None) -> list[str]:
    """Pages of the WikiText test file for ``task`` ("wikitext2" or "wikitext103"), first ``limit``."""
    pages = split_wikitext_pages(_read_text(data_file(task, data_dir)))
    return pages[:limit] if limit is not None else pages


def load_ptb(data_dir: str | Path | None = None, limit: int | None = None) -> list[str]:
    """The PTB test set as one document: the first ``limit`` sentences (all by default), each + "\\n"."""
    sents = [s.strip() for s in _read_text(data_file("ptb", data_dir)).split("\n") if s.strip()]
    sents = sents[:limit] if limit is not None else sents
    return ["".join(s + "\n" for s in sents)]


def wikitext_counts(page: str) -> tuple[int, int]:
    """(words, bytes) of an original (not detokenized) page, as the harness's ``wikitext`` counts them:
    ``len(re.split(r"\\s+", page))`` (empty strings at the ends included) and UTF-8 bytes."""
    return len(re.split(r"\s+", page)), len(page.encode("utf-8"))


def ptb_counts(doc: str) -> tuple[int, int]:
    """(words, bytes) of a PTB document: whitespace tokens plus one ``<eos>`` per sentence."""
    return len(doc.split()) + doc.count("\n"), len(doc.encode("utf-8"))


UNITS = {"lambada": "passages", "wikitext2": "pages", "wikitext103": "pages", "ptb": "sentences"}


@dataclass(frozen=True)
class Selection:
    """What a task scores under a word budget (``select``): the texts, and how much of the test file they are.

    ``texts`` are scored as they are: LAMBADA passages, WikiText pages (the last one cut after ``cut[0]`` of its
    ``cut[1]`` lines when the budget ends inside it), or PTB's one stream of the kept sentences. ``units`` of
    ``units_total`` passages / pages / sentences (a cut page counts as one); ``words`` of ``words_total`` words as
    each task's metric counts them (``len(text.split())`` for a LAMBADA passage, ``wikitext_counts``, ``ptb_counts``).
    """

    task: str
    texts: list[str]
    units: int
    units_total: int
    words: int
    words_total: int
    cut: tuple[int, int] | None = None

    @property
    def unit(self) -> str:
        """"passages", "pages" or "sentences"."""
        return UNITS[self.task]

    def describe(self) -> str:
        """"2 of 62 pages (the last cut after 12 of its 40 lines): 3,000 of 241,335 words (1.2%)"; the whole file:
        "62 of 62 pages: 241,335 words"."""
        what = f"{self.units} of {self.units_total} {self.unit}"
        if self.cut:
            what += f" (the last cut after {self.cut[0]} of its {self.cut[1]} lines)"
        if self.words == self.words_total:
            return f"{what}: {self.words:,} words"
        return f"{what}: {self.words:,} of {self.words_total:,} words ({100 * self.words / self.words_total:.2g}%)"


def select(task: str, data_dir: str | Path | None = None, words: int | None = None) -> Selection:
    """The first ``words`` words of ``task``'s test file (all of it when None), the same budget for every task: whole
    LAMBADA passages and PTB sentences, and WikiText pages whole up to the one the budget ends in, which keeps its
    first lines (a page's lines are its paragraphs and headings). Units are kept while the total stays within
    ``words``, and at least one (a passage, a page's first line, a sentence) however small the budget.

    Raises:
        KeyError: unknown task. FileNotFoundError: its file is missing.
    """
    if task == "lambada":
        units = load_lambada(data_dir)
        counts = [len(t.split()) for t in units]
    elif task in ("wikitext2", "wikitext103"):
        units = load_wikitext(task, data_dir)
        counts = [wikitext_counts(p)[0] for p in units]
    elif task == "ptb":
        units = [s.strip() for s in _read_text(data_file("ptb", data_dir)).split("\n") if s.strip()]
        counts = [len(s.split()) + 1 for s in units]  # + <eos>
    else:
        raise KeyError(f"unknown zero-shot task {task!r}; choose from {', '.join(TASK_FILES)}")
    pages = task.startswith("wikitext")  # a unit that can be cut
    kept, total, cut = 0, 0, None
    for n in counts:
        if words is not None and total + n > words and (kept or pages):
            break
        kept, total = kept + 1, total + n
    texts = units[:kept]
    if pages and kept < len(units):
        head, lines = _first_lines(units[kept], words - total, at_least_one=not kept)
        if lines:
            texts, kept, cut = [*texts, head], kept + 1, (lines, len(units[kept].split("\n")))
            total += wikitext_counts(head)[0]
    if task == "ptb":
        texts = ["".join(s + "\n" for s in texts)]
    return Selection(task, texts, kept, len(units), total, sum(counts), cut)


def _first_lines(page: str, words: int, at_least_one: bool) -> tuple[str, int]:
    """(the page's first lines holding at most ``words`` words by ``wikitext_counts``, how many lines; the page did
    not fit whole), one line at least with ``at_least_one`` (nothing of the task was kept before)."""
    lines = page.split("\n")
    best = 1 if at_least_one else 0
    for j in range(1, len(lines)):
        if wikitext_counts("\n".join(lines[:j]))[0] > words:
            break
        best = j
    return "\n".join(lines[:best]), best


def wikitext_detokenize(page: str) -> str:
    """lm-evaluation-harness's own WikiText detokenizer (imported, so the text matches it exactly)."""
    from lm_eval.tasks.wikitext.preprocess_wikitext import wikitext_detokenizer

    return wikitext_detokenizer({"page": page})
