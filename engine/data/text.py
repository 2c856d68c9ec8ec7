"""Word-level text corpora for the language models (docs/methods.md §11): WikiText-103 / WikiText-2
from their released files and ``fortunes``, the embedded default corpus (Debian's ``fortunes`` +
``fortunes-min``).

Each line becomes its words plus an end-of-line token ``<eos>`` (the PyTorch word-language-model convention
for WikiText, whose files are already tokenized and hold ``<unk>``). The vocabulary comes from the training
split only, ordered by frequency (ties by first occurrence); ``data.vocab_size`` keeps the most frequent
words and maps the rest, and any word unseen in training, to ``<unk>``. A split is one contiguous token
stream cut into non-overlapping sequences of ``data.seq_len`` inputs, each with its next-token targets; a
batch is ``data.batch_size`` sequences, ``x`` ``(B, T)`` and ``y`` flattened to ``(B * T,)``.

``fortunes``: the fortune files listed in ``FORTUNE_FILES`` (English prose and verse; the ASCII-art files
are left out), split into fortunes at the ``%`` lines, lower-cased, words and punctuation marks as tokens; a
fixed permutation (``data.split_seed``) assigns 90% of the fortunes to train, 5% to valid, 5% to test.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import torch

from engine.errors import DataError

FORTUNES_DIR = Path("/usr/share/games/fortunes")
FORTUNE_FILES = (
    "computers", "cookie", "debian", "definitions", "disclaimer", "drugs", "education", "ethnic", "food",
    "fortunes", "goedel", "humorists", "kids", "knghtbrd", "law", "linux", "linuxcookie", "literature", "love",
    "magic", "medicine", "men-women", "miscellaneous", "news", "paradoxum", "people", "perl", "pets",
    "platitudes", "politics", "pratchett", "riddles", "science", "songs-poems", "sports", "startrek", "tao",
    "translate-me", "wisdom", "work", "zippy",
)
WIKITEXT_FILES = ("wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens")
EOS, UNK = "<eos>", "<unk>"
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*|[^\sa-z0-9]")


class TokenSplit:
    """A token stream cut into sequences of ``seq_len`` (inputs) with their next-token targets."""

    def __init__(self, stream: torch.Tensor, seq_len: int, max_sequences: int | None = None):
        n = (len(stream) - 1) // seq_len
        if max_sequences is not None:
            n = min(n, max_sequences)
        self.stream, self.seq_len, self.n = stream, seq_len, n

    def __len__(self) -> int:
        return self.n

    @property
    def tokens(self) -> int:
        return self.n * self.seq_len

    def batches(self, batch_size: int, shuffle: bool, augment: bool = False, generator: torch.Generator | None = None,
                device: torch.device | None = None, shards: int = 1) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        t = self.seq_len
        order = torch.randperm(self.n, generator=generator) if shuffle else torch.arange(self.n)
        order = order[:self.n - self.n % shards]  # every batch splits into equal slices (see TensorSplit)
        offsets = torch.arange(t + 1)
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            rows = self.stream[idx[:, None] * t + offsets]  # (B, T + 1)
            x, y = rows[:, :-1], rows[:, 1:].reshape(-1)
            if device is not None and device.type != "cpu":
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            yield x, y


def build_vocab(lines: list[list[str]], vocab_size: int | None) -> dict[str, int]:
    """Word -> id from the training lines: by frequency, ties by first occurrence; ``<unk>`` added when any
    word is cut (or absent, so valid/test words unseen in training have an id)."""
    counts = Counter(w for line in lines for w in line)
    counts[EOS] += len(lines)
    words = sorted(counts, key=lambda w: -counts[w])  # stable: ties keep first-occurrence order
    if vocab_size is not None and len(words) + (UNK not in counts) > vocab_size:
        words = [w for w in words if w != UNK][: vocab_size - 1] + [UNK]
    elif UNK not in counts:
        words.append(UNK)
    return {w: i for i, w in enumerate(words)}


def encode(lines: list[list[str]], vocab: dict[str, int]) -> torch.Tensor:
    unk, eos = vocab[UNK], vocab[EOS]
    ids = [i for line in lines for i in [*(vocab.get(w, unk) for w in line), eos]]
    return torch.tensor(ids, dtype=torch.long)


def unigram_perplexity(train: torch.Tensor, test: torch.Tensor, vocab: int) -> float:
    """Perplexity of ``test`` under the training split's add-one unigram distribution (the baseline a
    language model must beat)."""
    counts = torch.bincount(train, minlength=vocab).double() + 1.0
    logp = torch.log(counts / counts.sum())
    return math.exp(-float(logp[test].mean())) if len(test) else float("nan")


def _read_wikitext(folder: Path) -> list[list[list[str]]]:
    out = []
    for name in WIKITEXT_FILES:
        path = folder / name
        if not path.is_file():
            raise DataError(f"data.data_dir: {folder} has no {name}; pass --data-dir to the folder of the released "
                            f"WikiText archive ({', '.join(WIKITEXT_FILES)})")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"data.data_dir: {path} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                            "expected the released WikiText files") from None
        out.append([line.split() for line in text.splitlines()])
    if not any(any(line) for line in out[0]):
        raise DataError(f"data.data_dir: {folder / WIKITEXT_FILES[0]} holds no words; expected the released "
                        "WikiText training split")
    return out


def fortune_texts(folder: Path = FORTUNES_DIR) -> list[str]:
    """Every fortune of ``FORTUNE_FILES`` in file order (a DataError naming the package when one is missing)."""
    texts = []
    for name in FORTUNE_FILES:
        path = folder / name
        if not path.is_file():
            raise DataError(f"data.data_dir: {folder} has no fortune file {name}; install the embedded corpus with "
                            "`apt-get install fortunes` (or `make install`), or pass --data-dir to a copy of "
                            f"{FORTUNES_DIR}")
        raw = path.read_text(encoding="utf-8", errors="replace")
        texts += [t.strip("\n") for t in re.split(r"(?m)^%\s*$", raw) if t.strip()]
    return texts


def _read_fortunes(folder: Path, split_seed: int) -> list[list[list[str]]]:
    texts = fortune_texts(folder)
    perm = torch.randperm(len(texts), generator=torch.Generator().manual_seed(split_seed)).tolist()
    n_val = n_test = len(texts) // 20
    parts = (sorted(perm[n_val + n_test:]), sorted(perm[:n_val]), sorted(perm[n_val:n_val + n_test]))
    tok = lambda line: _WORD.findall(line.lower())  # noqa: E731
    return [[tok(line) for i in idx for line in texts[i].splitlines()] for idx in parts]


def load_corpus(dataset: str, data_dir: str | None, split_seed: int, vocab_size: int | None):
    """(train, valid, test) id streams and the vocabulary of a text data set."""
    if dataset == "fortunes":
        splits = _read_fortunes(Path(data_dir) if data_dir else FORTUNES_DIR, split_seed)
    else:
        if not data_dir:
            raise DataError(f"data.data_dir: none given; {dataset} is read from its released files "
                            f"({', '.join(WIKITEXT_FILES)}): pass --data-dir")
        splits = _read_wikitext(Path(data_dir))
    vocab = build_vocab(splits[0], vocab_size)
    return [encode(lines, vocab) for lines in splits], vocab


def check_text(dataset: str, data_dir: str | None) -> None:
    """Fail fast when a text data set's files are not where the config says (no reading of the contents)."""
    if dataset == "fortunes":
        folder = Path(data_dir) if data_dir else FORTUNES_DIR
        missing = [n for n in FORTUNE_FILES if not (folder / n).is_file()]
        if missing:
            fortune_texts(folder)  # raises, naming the first missing file
        return
    if not data_dir:
        raise DataError(f"data.data_dir: none given; {dataset} is read from its released files "
                        f"({', '.join(WIKITEXT_FILES)}): pass --data-dir")
    for name in WIKITEXT_FILES:
        if not (Path(data_dir) / name).is_file():
            raise DataError(f"data.data_dir: {data_dir} has no {name}; pass --data-dir to the folder of the "
                            f"released WikiText archive ({', '.join(WIKITEXT_FILES)})")
