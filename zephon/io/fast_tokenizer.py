"""A faster, exact backend for ``tokenizer.json`` tokenizers: ``fastokens``, where it is verified.

Hugging Face ``tokenizers`` is the reference. ``fastokens`` (installed with the ``fast`` extra)
reads the same ``tokenizer.json`` and is many times faster, with ids returned as one flat array.
It is used only where it gives the reference's ids:

1. at load, on fixed probes (every short string over ``" #$a\\n"``, runs of one character up to
   600 long, many scripts, seeded random Unicode, special tokens inside text); the verdict is kept
   in ``~/.cache/zephon/tokenizers/`` under the hash of the tokenizer file and both libraries'
   versions, so a later load does not probe again. fastokens is built from the file in the form
   it builds from fastest (``fast_form``: merges as strings), the form the probes checked; it is
   kept beside the verdict after a first load and read by the later ones (fastokens only: the
   reference always reads the file itself);
2. then on a sample of the data: the first documents each process encodes (up to 256 of them and
   64 Ki characters, each cut to 4 Ki) go through both, and any difference turns the fast backend
   off for that tokenizer (recorded, logged). The sample is bounded in characters because the
   reference is the slow one: a chunk of whole source files through it would take a fifth of a
   second at every start. Where the reference encoded the first documents while the fast backend
   loaded, those (whole, within the same bounds) are the sample: their reference ids are already
   there, and the loading thread compares them before the fast backend serves a call.

Its choice never changes the ids, so it is not part of the recipe fingerprint. Its own threads are
set by ``FASTOKENS_BPE_THREADS`` (the process runner sets 1 in its workers).
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import json
import logging
import os
import random
import sys
import threading
import uuid
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)
VERDICTS = os.path.join("~", ".cache", "zephon", "tokenizers")


def probes() -> list[str]:
    """Texts that tell an exact reimplementation from a near one."""
    out = ["".join(p) for n in range(1, 5) for p in itertools.product(" #$a\n", repeat=n)]
    out += [c * n for c in " \n\t-=a.'0#" for n in (1, 2, 3, 7, 64, 600)]
    out += [
        "Привет, мир!", "你好，世界。", "こんにちは世界", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया",
        "안녕하세요", "Γειά σου Κόσμε", "👍🏽🇫🇷👨‍👩‍👧", "\u200b\u200d\u2060",
        "e\u0301 caf\u00e9 \ufb01 \uff21\uff22\uff23",
        "I'm you're we'll they've don't DON'T", "1234567890 3.14159 1e-9 $12,345.67",
        "def f(x):\n    return x ** 2  # comment\n\n\n", "https://example.com/a?b=c&d=e#f",
        "abc<|endoftext|>def", "<|endoftext|>", "  <|endoftext|>  x", "## ### #### a##b",
        "\r\n\r\n", "tab\tseparated\tvalues", "MiXeD CaSe WoRdS",
    ]  # fmt: skip
    rng = random.Random(0)
    ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F),
              (0x3040, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0x1F300, 0x1F64F)]  # fmt: skip
    for _ in range(300):
        parts = [chr(rng.randint(*rng.choice(ranges))) for _ in range(rng.randint(1, 40))]
        out.append("".join(parts))
    return out


SAMPLE_TEXTS, SAMPLE_CHARS, SAMPLE_CUT = 256, 64 << 10, 4 << 10  # the data sample's bounds


def data_sample(
    texts: list[str], most: int = SAMPLE_TEXTS, chars: int = SAMPLE_CHARS, cut: int = SAMPLE_CUT
) -> list[str]:
    """The first texts, each cut to ``cut`` characters, up to ``most`` texts and ``chars`` in all
    (a cut text is as good a probe as a whole one: both backends encode the same string)."""
    out, total = [], 0
    for text in texts[:most]:
        if total >= chars:
            break
        out.append(text[:cut])
        total += len(out[-1])
    return out


def first_difference(reference, fast, texts: list[str]) -> str | None:
    """The first text on which the backends' ids differ, or None."""
    return _differs(fast, texts, [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)])


def _differs(fast, texts: list[str], want: list[list[int]]) -> str | None:
    """The first of ``texts`` whose fastokens ids are not ``want``'s (the reference's), or None."""
    ids, offsets = _flat(fast, texts)
    for text, a, b, ref in zip(texts, offsets[:-1], offsets[1:], want, strict=True):
        if ids[a:b].tolist() != ref:
            return text
    return None


def _flat(fast, texts: list[str]):
    import numpy as np

    ids, offsets = fast.encode_batch_flat(texts)
    return np.frombuffer(ids, np.uint32), np.frombuffer(offsets, np.uint64).astype(np.int64)


# encoded once at load (letters, digits, punctuation, spaces, a newline): fastokens' first call
# builds state it keeps for every later call, 40 ms for GPT-2 here, which the first chunk waited
# for in every process, and in every process worker forked from a server that had not encoded yet
WARM_UP = "Warm up: 12 words, done.\n"


class FastBackend:
    """``fastokens`` for one tokenizer file, checked against the reference as described above.

    It loads in a background thread (building it takes a few tenths of a second, on a core of
    its own: it releases the GIL; probing takes as much again the first time), started before
    the reference is built, which joins it with :meth:`attach`. The reference's build, which
    holds the GIL, begins once fastokens' is under way (:meth:`started`): side by side over 8M
    tokens, with the kept fast form, the fast backend was ready 0.16 s sooner and the run ended
    20% sooner. Until it is ready:

    - The reference encodes texts of up to ``small`` characters **in all**: a run's first
      chunks, about a first batch's worth. It is done with one in tens of milliseconds, while
      the loading has tenths of a second to go.
    - Past that budget, callers wait for the fast backend. Once loaded, it encodes in a few
      milliseconds what the reference would have encoded meanwhile, and the reference's encoding
      slows the loading beside it. The texts the reference did encode are the data sample,
      checked against ids already there. Side by side over 8M tokens, against the reference
      encoding until the loading ended and sampling after it: inline 10.94M tokens/s against
      10.63M, two process workers 7.82-8.81M against 6.85-7.17M.

    The reference encodes **one call at a time**, on one core (``meanwhile``: the tokenizers'
    own thread pool would take the loading's core too). Thread workers reading ahead would
    otherwise put every chunk in sight through the reference, on every core, and starve the
    loading of the core it needs (measured: two thread workers sent a second and a half of CPU
    through the reference over a run of 8M tokens, the inline runner a tenth of a second). A
    caller that finds the reference busy waits for whichever comes first, the reference or the
    fast backend. Larger texts wait for the fast backend up to ``patience`` seconds: the reference would take
    longer over them (a 1 MiB chunk is about a third of a second for it on one core, a few
    milliseconds for fastokens) and compete for the cores the loading needs. Past that, and
    wherever it is not exact, the reference encodes: the same ids either way.
    """

    patience = 5.0
    small = 256 << 10  # characters in all: the reference takes about 80 ms over them on one core

    def __init__(self, raw_json: bytes, key: str, verdict: bool | None):
        self.reference, self.key, self.fast = None, key, None
        self.form_path = _form_path(key)  # (where VERDICTS points now, not when the loading ends)
        self.attached = threading.Event()
        self.on, self.sampled, self.lock = True, False, threading.Lock()
        self.ready = threading.Event()
        self.building = threading.Event()  # set once inside fastokens' build, or done
        # while loading: the callers encoding with the reference (one, but for those past
        # patience); notified when one is done and when the loading is
        self.turn, self.referencing = threading.Condition(), 0
        self.budget = self.small  # characters the reference may still encode while loading
        # (text, its reference ids) of those, for the sample; None once the loading has taken them
        self.seen: list[tuple[str, list[int]]] | None = []
        # not a daemon: the interpreter waits for it at exit (under a second) instead of stopping
        # it inside fastokens' native code, which aborts the process (SIGABRT)
        self.loading = threading.Thread(
            target=self._load, args=(raw_json, verdict), name="zephon-fastokens", daemon=False
        )
        self.loading.start()

    def _load(self, raw_json: bytes, verdict: bool | None) -> None:
        import fastokens

        # fastokens is always built from fast_form(raw_json) (the file itself where it is None),
        # kept after a first load: what the probes checked (the key names FORM) is what is built
        kept, made, fast = None, None, None
        try:
            kept = _read(self.form_path)  # None: not kept yet; b"": the file as it is
            if kept is not None:
                try:
                    fast = self._build(fastokens, kept or raw_json)
                except Exception as e:  # a kept form that fails: made again, and kept again
                    log.info("zephon: fastokens cannot read its kept form (%s); making it again", e)
                    kept = None
            if fast is None:
                made = fast_form(raw_json) or b""
                fast = self._build(fastokens, made or raw_json)
            self.attached.wait()
            if self.reference is None:  # the reference did not load: no tokenizer to serve
                verdict = False
            elif verdict is None:
                different = first_difference(self.reference, fast, probes())
                _record(self.key, different is None, different)
                verdict = different is None
            if verdict:  # its first call builds what it keeps for all calls: here, not in a unit
                fast.encode_batch_flat([WARM_UP])
                verdict = self._check_seen(fast)
        except BaseException as e:  # a file it cannot read (or a panic): the reference serves it
            log.info("zephon: fastokens cannot load this tokenizer (%s); using tokenizers", e)
            verdict = False
        self.fast, self.on = (fast, True) if verdict else (None, False)
        with self.turn:
            self.building.set()
            self.ready.set()
            self.turn.notify_all()
        if verdict and made is not None:  # once per tokenizer file, after the loading: for the next
            _write(self.form_path, made)

    def _build(self, fastokens, spec: bytes):
        text = spec.decode("utf-8")
        self.building.set()  # from here on it holds no GIL: the reference may load beside it
        return fastokens.Tokenizer.from_json_str(text)

    def started(self, timeout: float = 1.0) -> None:
        """Wait until the loading thread is inside fastokens' build, or done, up to ``timeout``.
        The reference's build holds the GIL throughout (85 ms for GPT-2 here): begun first, it
        kept the loading thread from starting its own (which lets go of the GIL) for as long,
        and the fast backend was ready that much later."""
        self.building.wait(timeout)

    def _check_seen(self, fast) -> bool:
        """The data sample, where the reference encoded one while loading: fastokens' ids
        against the reference's for those texts (True where they are the same, or there are none:
        the first call samples then)."""
        with self.lock:
            seen, self.seen = self.seen, None  # a call that ends later keeps nothing
            self.sampled = bool(seen)
        different = _differs(fast, [text for text, _ in seen], [want for _, want in seen]) if seen else None
        if different is not None:
            self._differs_on(different)
        return different is None

    def _differs_on(self, text: str) -> None:
        """fastokens gave other ids than the reference on ``text``: recorded, and said."""
        _record(self.key, False, text)
        log.warning("zephon: fastokens differs from tokenizers on %r; using tokenizers", text[:80])

    def _keep_seen(self, texts: list[str], ids, offsets) -> None:
        """Keep the first of ``texts`` the reference encoded as ``ids`` (flat, at ``offsets``),
        whole, within the data sample's bounds (``data_sample``)."""
        with self.lock:
            if self.seen is None:
                return
            total = sum(len(text) for text, _ in self.seen)
            for text, a, b in zip(texts, offsets[:-1], offsets[1:], strict=True):
                if len(self.seen) >= SAMPLE_TEXTS:
                    break
                if len(text) <= SAMPLE_CUT and total + len(text) <= SAMPLE_CHARS:
                    self.seen.append((text, ids[a:b].tolist()))
                    total += len(text)

    def attach(self, reference) -> None:
        """The reference tokenizer (Hugging Face ``tokenizers``) to probe and sample against."""
        self.reference = reference
        self.attached.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether it is on, once loaded and probed (False if not loaded within ``timeout``)."""
        return self.ready.wait(timeout) and self.on

    def encode_flat(
        self,
        texts: list[str],
        reference: Callable[[list[str]], Any],
        meanwhile: Callable[[list[str]], Any] | None = None,
    ):
        """(ids uint32, offsets int64 [n + 1]) from fastokens, or ``reference(texts)`` where the
        reference must encode (see the class); ``meanwhile``: the reference on one core, for
        the texts it encodes while the fast backend loads on the other (default ``reference``)."""
        # the texts' size only while loading: past it, no call pays for the sum
        if not self.ready.is_set() and (size := sum(map(len, texts))) <= self.budget:
            with self.turn:  # the reference's turn, or the fast backend, whichever comes first
                self.turn.wait_for(lambda: self.ready.is_set() or not self.referencing, self.patience)
                # its turn (or past patience), within the budget; else the fast backend, below
                mine = not self.ready.is_set() and size <= self.budget
                self.budget -= size if mine else 0
                self.referencing += mine
            if mine:
                try:
                    ids, offsets = (meanwhile or reference)(texts)
                    self._keep_seen(texts, ids, offsets)
                    return ids, offsets
                finally:
                    with self.turn:
                        self.referencing -= 1
                        self.turn.notify()
        if not self.wait(self.patience):
            return reference(texts)
        ids, offsets = _flat(self.fast, texts)
        with self.lock:
            sample, self.sampled = not self.sampled, True
        if sample:
            different = first_difference(self.reference, self.fast, data_sample(texts))
            if different is not None:
                self.on = False
                self._differs_on(different)
                return reference(texts)
        return ids, offsets


def load(raw_json: bytes) -> FastBackend | None:
    """The fast backend for this tokenizer file, loading, or None (not installed, or known not
    to be exact). Give it the reference with :meth:`FastBackend.attach` before using it."""
    try:
        import fastokens  # noqa: F401 - only whether it is there
    except ImportError:
        return None
    import tokenizers  # noqa: F401 - imported to load the reference anyway

    versions = [*(installed_version(p) for p in ("fastokens", "tokenizers")), f"form {FORM}"]
    key = hashlib.sha256(raw_json + json.dumps(versions).encode()).hexdigest()[:32]
    verdict = _verdict(key)
    return None if verdict is False else FastBackend(raw_json, key, verdict)


def installed_version(package: str) -> str:
    """The installed version of imported ``package``, as ``importlib.metadata.version`` gives it,
    read from the name of the one ``PACKAGE-VERSION.dist-info`` folder beside it; where there is
    not exactly one (an editable install, an unusual layout), importlib.metadata's answer.
    Importing importlib.metadata (with email, zipfile and csv) took 20 ms here, a seventh of
    ``import zephon``, on the way to a loader's first batch and in every fork server's start."""
    site = os.path.dirname(os.path.dirname(os.path.abspath(sys.modules[package].__file__)))
    found = glob.glob(os.path.join(glob.escape(site), f"{package}-*.dist-info"))
    if len(found) == 1:
        return os.path.basename(found[0])[len(package) + 1 : -len(".dist-info")]
    import importlib.metadata

    return importlib.metadata.version(package)


def _path(key: str) -> str:
    return os.path.join(os.path.expanduser(VERDICTS), key + ".json")


FORM = 1  # fast_form's version: in the verdict's key, so that a verdict covers the form built


def fast_form(raw_json: bytes) -> bytes | None:
    """The tokenizer file with its BPE merges as ``"left right"`` strings instead of pairs, or
    None where there is nothing to change (or a merge's part holds a space, which only the pair
    form can say). Both forms are the same tokenizer to both libraries (tokenizers gives the
    same file back from either); fastokens builds from this one in four fifths of the time
    (229 against 288 ms of CPU for GPT-2 here: it reads each pair as a JSON value of its own)."""
    import msgspec

    try:
        spec = msgspec.json.decode(raw_json)
    except msgspec.DecodeError:
        return None
    model = spec.get("model") if isinstance(spec, dict) else None
    merges = model.get("merges") if isinstance(model, dict) else None
    if not isinstance(merges, list) or not merges:
        return None
    for merge in merges:
        if not (isinstance(merge, list) and len(merge) == 2):
            return None
        if not all(isinstance(part, str) and " " not in part for part in merge):
            return None
    model["merges"] = [f"{left} {right}" for left, right in merges]
    try:
        return msgspec.json.encode(spec)
    except (TypeError, ValueError, OverflowError):  # (a number past 64 bits, say): the file
        return None


def _form_path(key: str) -> str:
    return os.path.join(os.path.expanduser(VERDICTS), key + ".tokenizer.json")


def _read(path: str) -> bytes | None:
    """A kept fast form (b"": the file as it is), or None where none is kept."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _verdict(key: str) -> bool | None:
    try:
        with open(_path(key)) as f:
            return bool(json.load(f)["exact"])
    except (OSError, ValueError, KeyError):
        return None


def _record(key: str, exact: bool, different: str | None) -> None:
    _write(_path(key), json.dumps({"exact": exact, "first_difference": different}).encode())


def _write(path: str, content: bytes) -> None:
    """``content`` at ``path``, whole or not at all (written beside it, then renamed)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(content)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):  # not renamed: a full disk, say
                os.remove(tmp)
    except OSError as e:  # only a cache: probing (or reading the file) again next time is the cost
        log.info("zephon: cannot keep %s (%s)", path, e)
