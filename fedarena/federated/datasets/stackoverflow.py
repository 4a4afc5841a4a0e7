"""TensorFlow Federated's Stack Overflow data read per client: next-word prediction and tag prediction.

The data set (``tff.simulation.datasets.stackoverflow``; Stack Overflow questions and answers, one client per
user) comes in two layouts, both read here from ``data.path`` without TensorFlow:

* **HDF5** (TFF's ``stackoverflow.tar.bz2``): ``stackoverflow_train.h5``, ``stackoverflow_held_out.h5`` and
  ``stackoverflow_test.h5``, each a group ``examples`` with one group per client id holding one dataset per
  feature -- ``tokens`` (a sentence's words separated by single spaces), ``title``, ``tags`` (separated by
  ``|``), ``creation_date``, ``type`` (byte strings) and ``score`` (integers) -- all of the client's length.
* **SQLite** (TFF's later ``stackoverflow.sqlite``): a table ``examples(split_name, client_id,
  serialized_example_proto)`` whose blobs are serialized ``tf.train.Example`` protocol buffers with the same
  features, and a table ``client_metadata(client_id, split_name, num_examples)``; the splits are named
  ``train``, ``heldout`` and ``test``. The protocol buffers are decoded by :func:`parse_example` (the wire
  format of ``tf.train.Example``: ``Features`` map of ``BytesList`` / ``FloatList`` / ``Int64List``), so no
  TensorFlow is needed.

A client's training examples are its ``train`` split and its held-out examples its ``test`` split (the same
user ids; TFF's ``held_out`` split holds other users and is not read). The vocabularies come from the count
files TFF ships beside the data: ``stackoverflow.word_count`` (lines ``word count``, most frequent first) and
``stackoverflow.tag_count`` (a JSON object tag -> count), or from ``data.vocab_path`` (a word-count file; its
folder is searched for the tag-count file).

Tasks, as Reddi et al. (ICLR 2021, "Adaptive Federated Optimization", Appendix C) after TFF's preprocessing:

* ``nwp`` -- next-word prediction: the vocabulary is the 10,000 most frequent words plus four special tokens,
  pad 0, words 1..10,000, out-of-vocabulary 10,001, beginning 10,002 and end of sentence 10,003 (10,004
  classes). A sentence (``tokens`` split at single spaces) is cut to its first 20 words, an end token is
  appended when it had fewer than 20, a beginning token is put in front, and pad ids fill it up to 21: one
  example of ``T + 1 = 21`` token ids, the layout of the language models of :mod:`fedarena.federated.models`
  (the model reads the first 20 and predicts each next one). Its label is its last non-pad id.
* ``tag`` -- tag prediction (Reddi et al.'s "Stack Overflow LR"): the features are the bag of words of
  ``tokens`` and ``title`` over the 10,000-word vocabulary (each word's share of the sentence's words; words
  outside it count in the length only) followed by the multi-hot vector of the example's tags over the 500
  most frequent tags (10,500 values); the multi-label logistic regression ``tag_lr`` reads the first 10,000
  and is trained on the last 500. The label (the simulation keeps one per example) is the example's most
  frequent tag in the vocabulary, or tag 0 when it has none.

A user's training split is cut to its first 1,000 examples (``MAX_TRAIN_EXAMPLES``, the authors' per-user cap in
both tasks); its test split is kept whole. Every client's example counts and labels go into the index once
(:mod:`fedarena.federated.datasets.index`); indexing tokenizes every sentence once. A round reads only its
clients (one HDF5 group, or one SQL query over the client's rowid range recorded at indexing, so the database
needs no index on ``client_id``).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import numpy as np

from fedarena.federated.data import DataError
from fedarena.federated.datasets.index import ClientIndex, IndexBuilder

VOCAB_SIZE = 10_000
"""words of the next-word and tag vocabularies (the most frequent in the word-count file)"""
TAG_VOCAB_SIZE = 500
SEQ_LEN = 20
"""words per next-word example (the model reads ``SEQ_LEN`` ids and predicts the next ``SEQ_LEN``)"""
MAX_TRAIN_EXAMPLES = 1000
"""training examples kept per user, its first in file order (the authors' ``max_elements_per_user`` of both
tasks, google-research/federated ``optimization/docs/hyperparameters.md``); a user's test split is kept whole"""
PAD = 0
WORD_COUNT_FILE = "stackoverflow.word_count"
TAG_COUNT_FILE = "stackoverflow.tag_count"
H5_SPLITS = ("stackoverflow_train.h5", "stackoverflow_test.h5")
SQL_FILE = "stackoverflow.sqlite"
SQL_SPLITS = ("train", "test")
FEATURES = ("tokens", "title", "tags")


# ----------------------------------------------------------------------------- tf.train.Example, decoded


class ProtoError(ValueError):
    """A blob that is not a well-formed ``tf.train.Example``."""


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ProtoError("truncated varint")
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, i
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of a message: ints for varints, bytes for length-delimited values."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i)
        elif wt == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise ProtoError("length past the end of the message")
            v, i = buf[i: i + n], i + n
        elif wt == 1:
            v, i = buf[i: i + 8], i + 8
        elif wt == 5:
            v, i = buf[i: i + 4], i + 4
        else:
            raise ProtoError(f"wire type {wt}")
        if i > len(buf):
            raise ProtoError("fixed-width value past the end of the message")
        yield num, wt, v


def _feature(buf: bytes) -> list:
    """A ``Feature``: its ``BytesList`` (bytes), ``Int64List`` (ints) or ``FloatList`` (floats) values."""
    for num, wt, v in _fields(buf):
        if wt != 2:
            continue
        if num == 1:
            return [x for n, w, x in _fields(v) if n == 1 and w == 2]
        if num == 3:
            out = []
            for n, w, x in _fields(v):
                if n == 1 and w == 2:  # packed
                    j = 0
                    while j < len(x):
                        val, j = _varint(x, j)
                        out.append(val - (1 << 64) if val >= 1 << 63 else val)
                elif n == 1 and w == 0:
                    out.append(x - (1 << 64) if x >= 1 << 63 else x)
            return out
        if num == 2:
            out = []
            for n, w, x in _fields(v):
                if n == 1 and w == 2:
                    out.extend(np.frombuffer(x, "<f4").tolist())
                elif n == 1 and w == 5:
                    out.append(float(np.frombuffer(x, "<f4")[0]))
            return out
    return []


def parse_example(blob: bytes) -> dict[str, list]:
    """The features of a serialized ``tf.train.Example``: name -> list of values (bytes, ints or floats)."""
    out: dict[str, list] = {}
    for num, wt, features in _fields(bytes(blob)):
        if num != 1 or wt != 2:
            continue
        for n, w, entry in _fields(features):
            if n != 1 or w != 2:
                continue
            name, value = None, b""
            for k, kw, kv in _fields(entry):
                if k == 1 and kw == 2:
                    name = kv.decode("utf-8", "replace")
                elif k == 2 and kw == 2:
                    value = kv
            if name is not None:
                out[name] = _feature(value)
    return out


# ----------------------------------------------------------------------------- vocabularies


def read_word_counts(path: Path, size: int = VOCAB_SIZE) -> list[str]:
    """The first ``size`` words of a TFF word-count file (``word count`` per line, most frequent first)."""
    words: list[str] = []
    try:
        with open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                parts = line.split()
                if len(parts) != 2 or not parts[1].isdigit():
                    raise DataError("data.vocab_path", f"{path}: line {n} is not 'word count'")
                words.append(parts[0])
                if len(words) >= size:
                    break
    except OSError as e:
        raise DataError("data.vocab_path", f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise DataError("data.vocab_path", f"{path}: not a UTF-8 text file") from None
    if not words:
        raise DataError("data.vocab_path", f"{path}: no words")
    return words


def read_tag_counts(path: Path, size: int = TAG_VOCAB_SIZE) -> list[str]:
    """The ``size`` most frequent tags of a TFF tag-count file (a JSON object tag -> count; ties keep file order)."""
    try:
        counts = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise DataError("data.path", f"{path}: cannot read ({e.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError("data.path", f"{path}: not a JSON tag-count file ({str(e).splitlines()[0]})") from None
    if not isinstance(counts, dict) or not counts or \
            not all(isinstance(v, int) and not isinstance(v, bool) for v in counts.values()):
        raise DataError("data.path", f"{path}: not a JSON object of tag -> count")
    return [t for t, _ in sorted(counts.items(), key=lambda kv: -kv[1])][:size]


# ----------------------------------------------------------------------------- examples


class Vocab:
    """Words and tags -> ids of the two tasks (see the module doc)."""

    def __init__(self, words: list[str], tags: list[str] | None) -> None:
        self.words = {w: i + 1 for i, w in enumerate(words)}
        self.size = len(words)
        self.oov, self.bos, self.eos = self.size + 1, self.size + 2, self.size + 3
        self.tags = {t: i for i, t in enumerate(tags or [])}

    def sentence(self, tokens: bytes) -> np.ndarray:
        """The 21 ids of one next-word example."""
        words = tokens.decode("utf-8", "replace").split(" ")[:SEQ_LEN]
        ids = [self.words.get(w, self.oov) for w in words]
        if len(ids) < SEQ_LEN:
            ids.append(self.eos)
        out = np.zeros(SEQ_LEN + 1, np.int64)
        out[0] = self.bos
        out[1: len(ids) + 1] = ids
        return out

    def bag(self, tokens: bytes, title: bytes) -> np.ndarray:
        """The bag of words of ``tokens`` and ``title`` over the word vocabulary (shares of the words)."""
        words = (tokens + b" " + title).decode("utf-8", "replace").split()
        out = np.zeros(self.size, np.float32)
        for w in words:
            i = self.words.get(w)
            if i is not None:
                out[i - 1] += 1.0
        return out / max(len(words), 1)

    def tag_vector(self, tags: bytes) -> np.ndarray:
        out = np.zeros(len(self.tags), np.float32)
        for t in tags.decode("utf-8", "replace").split("|"):
            i = self.tags.get(t)
            if i is not None:
                out[i] = 1.0
        return out


def _as_bytes(v) -> bytes:
    return v if isinstance(v, bytes) else bytes(v) if isinstance(v, (bytearray, np.bytes_)) else str(v).encode()


class StackOverflowReader:
    """TFF's Stack Overflow (HDF5 or SQLite) for ``task`` ``nwp`` or ``tag``; :meth:`read` gives a client's
    examples (train split, at most ``MAX_TRAIN_EXAMPLES``, then test split) and labels."""

    index_version = f"train{MAX_TRAIN_EXAMPLES}"
    """part of the index cache's key: indexes built before the training cap are not reused"""

    def __init__(self, path: str | Path, task: str, vocab_path: str = "") -> None:
        if task not in ("nwp", "tag"):
            raise DataError("data.dataset", f"unknown Stack Overflow task {task!r}")
        self.task, self.path = task, Path(path)
        folder = self.path if self.path.is_dir() else self.path.parent
        if self.path.is_file():
            self.layout = "sqlite" if self.path.suffix in (".sqlite", ".db", ".sqlite3") else "hdf5"
            self.files = [self.path]
        elif (folder / SQL_FILE).is_file():
            self.layout, self.files = "sqlite", [folder / SQL_FILE]
        elif (folder / H5_SPLITS[0]).is_file():
            self.layout = "hdf5"
            self.files = [folder / f for f in H5_SPLITS if (folder / f).is_file()]
        else:
            raise DataError("data.path", f"{self.path}: no {SQL_FILE} or {H5_SPLITS[0]} (TFF's Stack Overflow "
                            "layouts)")
        wc = Path(vocab_path) if vocab_path else folder / WORD_COUNT_FILE
        if not wc.is_file():
            raise DataError("data.vocab_path", f"{wc}: no word-count file (TFF's {WORD_COUNT_FILE}; set "
                            "data.vocab_path)")
        tags = None
        if task == "tag":
            tc = wc.parent / TAG_COUNT_FILE
            if not tc.is_file():
                tc = folder / TAG_COUNT_FILE
            if not tc.is_file():
                raise DataError("data.path", f"{tc}: no tag-count file (TFF's {TAG_COUNT_FILE})")
            tags = read_tag_counts(tc)
            self.vocab_files = [wc, tc]
        else:
            self.vocab_files = [wc]
        self.vocab = Vocab(read_word_counts(wc), tags)
        if task == "nwp":
            self.num_classes = self.vocab.size + 4
            self.example_shape = (SEQ_LEN + 1,)
        else:
            self.num_classes = len(self.vocab.tags)
            self.example_shape = (self.vocab.size + self.num_classes,)
        self._open: list = []
        self._lock = threading.Lock()

    # -------------------------------------------------------------- examples of raw features

    def _examples(self, feats: dict[str, list[bytes]], where: str, part: int) -> tuple[np.ndarray, np.ndarray]:
        """The examples and labels of one client's split ``part`` (0 train, capped at ``MAX_TRAIN_EXAMPLES``; 1
        test)."""
        if part == 0:
            feats = {k: v[:MAX_TRAIN_EXAMPLES] for k, v in feats.items()}
        n = len(feats["tokens"])
        if self.task == "nwp":
            x = np.stack([self.vocab.sentence(t) for t in feats["tokens"]]) if n else \
                np.zeros((0, SEQ_LEN + 1), np.int64)
            last = (x != PAD).sum(1) - 1
            return x, x[np.arange(n), last]
        for k in ("title", "tags"):
            if len(feats[k]) != n:
                raise DataError("data.path", f"{where}: {k} has {len(feats[k])} values, tokens {n}")
        bags = [self.vocab.bag(t, ti) for t, ti in zip(feats["tokens"], feats["title"])]
        tagv = [self.vocab.tag_vector(t) for t in feats["tags"]]
        x = np.concatenate([np.stack(bags), np.stack(tagv)], 1) if n else np.zeros((0, *self.example_shape))
        y = np.array([int(np.argmax(t)) if t.any() else 0 for t in tagv], np.int64)
        return x.astype(np.float32), y

    # -------------------------------------------------------------- HDF5

    def _h5(self, fid: int):
        while len(self._open) <= fid:
            f = self.files[len(self._open)]
            try:
                import h5py

                self._open.append(h5py.File(f, "r"))
            except OSError as e:
                raise DataError("data.path", f"{f}: not a readable HDF5 file ({str(e).split('(')[0].strip()})") \
                    from None
        return self._open[fid]

    def _h5_client(self, fid: int, cid: str) -> dict[str, list[bytes]]:
        f = self.files[fid]
        need = ("tokens",) if self.task == "nwp" else FEATURES
        try:
            g = self._h5(fid)["examples"][cid]
            return {k: [_as_bytes(v) for v in np.asarray(g[k][()]).reshape(-1)] for k in need}
        except KeyError as e:
            raise DataError("data.path", f"{f}: client {cid!r} lacks {e}") from None
        except (OSError, RuntimeError, ValueError, TypeError) as e:
            raise DataError("data.path", f"{f}: client {cid!r}: unreadable ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''})") from None

    # -------------------------------------------------------------- SQLite

    def _db(self) -> sqlite3.Connection:
        if not self._open:
            f = self.files[0]
            try:
                con = sqlite3.connect(f"file:{f}?mode=ro", uri=True, check_same_thread=False)
                tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                cols = {r[1] for r in con.execute("PRAGMA table_info(examples)")}
            except sqlite3.DatabaseError as e:
                raise DataError("data.path", f"{f}: not a readable SQLite database ({e})") from None
            if "examples" not in tables or not {"split_name", "client_id", "serialized_example_proto"} <= cols:
                raise DataError("data.path", f"{f}: no table examples(split_name, client_id, "
                                "serialized_example_proto) (TFF's SQL client-data layout)")
            self._open.append(con)
        return self._open[0]

    def _sql_rows(self, split: str):
        """(client id, rowid, blob) of every example of ``split``, grouped by client in row order."""
        return self._db().execute("SELECT client_id, rowid, serialized_example_proto FROM examples "
                                  "WHERE split_name = ? ORDER BY client_id, rowid", (split,))

    def _sql_client(self, cid: str, split: str, first: int, last: int) -> list[bytes]:
        """The blobs of one client's split, in row order: the rowid range recorded at indexing bounds the
        search, so no index on client_id is needed."""
        return [r[0] for r in self._db().execute(
            "SELECT serialized_example_proto FROM examples WHERE rowid BETWEEN ? AND ? AND client_id = ? "
            "AND split_name = ? ORDER BY rowid", (first, last, cid, split))]

    def _sql_features(self, rows, cid: str) -> dict[str, list[bytes]]:
        feats: dict[str, list[bytes]] = {k: [] for k in FEATURES}
        for blob in rows:
            try:
                ex = parse_example(blob)
            except (ProtoError, TypeError, IndexError) as e:
                raise DataError("data.path", f"{self.files[0]}: client {cid!r}: corrupt tf.train.Example ({e})") \
                    from None
            for k in FEATURES:
                v = ex.get(k)
                if not v or not isinstance(v[0], bytes):
                    raise DataError("data.path", f"{self.files[0]}: client {cid!r}: an example lacks the bytes "
                                    f"feature {k!r}")
                feats[k].append(v[0])
        return feats

    # -------------------------------------------------------------- index and read

    def scan(self) -> ClientIndex:
        try:
            return self._scan()
        except DataError:
            raise
        except (OSError, RuntimeError, ValueError, TypeError, sqlite3.DatabaseError) as e:
            raise DataError("data.path", f"{self.files[0]}: unreadable ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''})") from None

    def _scan(self) -> ClientIndex:
        b = IndexBuilder(parts=2)
        if self.layout == "hdf5":
            for fid, f in enumerate(self.files):
                h = self._h5(fid)
                if "examples" not in h:
                    raise DataError("data.path", f"{f}: no 'examples' group (not TFF's HDF5 client-data layout)")
                for cid in h["examples"]:
                    _, y = self._examples(self._h5_client(fid, cid), f"{f}: client {cid!r}", fid)
                    b.add(str(cid), fid, fid, 0, 0, y)
        else:
            for part, split in enumerate(SQL_SPLITS):
                cur, rows, ids = None, [], []
                for cid, rowid, blob in self._sql_rows(split):
                    if cid != cur and cur is not None:
                        # offset / length: the client's first rowid and the span to its last
                        b.add(str(cur), part, 0, ids[0], ids[-1] - ids[0],
                              self._examples(self._sql_features(rows, cur), cur, part)[1])
                        rows, ids = [], []
                    cur = cid
                    rows.append(blob)
                    ids.append(rowid)
                if cur is not None:
                    b.add(str(cur), part, 0, ids[0], ids[-1] - ids[0],
                          self._examples(self._sql_features(rows, cur), cur, part)[1])
        ix = b.build_checked(self.files[0], held_part=1, empty="no clients", who="client")
        return ix

    def read(self, ix: ClientIndex, u: int) -> tuple[np.ndarray, np.ndarray]:
        """Client ``u``'s examples (int64 (n, 21) token ids, or float32 (n, 10,500) bag of words and tags) and
        labels."""
        xs, ys = [], []
        cid = str(ix.users[u])
        for p in range(ix.file.shape[1]):
            fid = int(ix.file[u, p])
            if fid < 0:
                continue
            with self._lock:
                if self.layout == "hdf5":
                    feats = self._h5_client(fid, cid)
                else:
                    first = int(ix.offset[u, p])
                    try:
                        blobs = self._sql_client(cid, SQL_SPLITS[p], first, first + int(ix.length[u, p]))
                    except sqlite3.DatabaseError as e:
                        raise DataError("data.path", f"{self.files[0]}: client {cid!r}: unreadable ({e})") from None
                    feats = self._sql_features(blobs, cid)
            x, y = self._examples(feats, f"{self.files[fid]}: client {cid!r}", p)
            xs.append(x)
            ys.append(y)
        return np.concatenate(xs), np.concatenate(ys)

    def close(self) -> None:
        for h in self._open:
            h.close()
        self._open.clear()
