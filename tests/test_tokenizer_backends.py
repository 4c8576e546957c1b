"""The fast tokenizer backend: the reference's ids or nothing."""

from __future__ import annotations

import itertools
import sys
import time

import numpy as np
import pytest
from support.hostile import hostile_texts, write_hostile_jsonl

from zephon import Dataset, Pipeline
from zephon.io import fast_tokenizer, tokenizer
from zephon.io.tokenizer import load_tokenizer
from zephon.testing import drain
from zephon.testing.data import kjv_records, python_source_documents


@pytest.fixture
def held_loading(monkeypatch):
    """The fast backend's loading held until the test sets the gate it yields; released at the
    test's end whatever it gave (the loading thread is not a daemon: held, the process would
    not exit)."""
    yield from _held(monkeypatch)


def _held(monkeypatch):
    import threading

    gate = threading.Event()
    real = fast_tokenizer.FastBackend._load
    # held, it counts as begun: the reference builds beside it without waiting (``started``)
    held = lambda self, *a: (self.building.set(), gate.wait(), real(self, *a))  # noqa: E731
    monkeypatch.setattr(fast_tokenizer.FastBackend, "_load", held)
    monkeypatch.setattr(fast_tokenizer.FastBackend, "patience", 60.0)
    yield gate
    gate.set()


def _no_reference(texts):
    raise AssertionError("the reference encoded where fastokens was to")


@pytest.fixture
def fresh_tokenizers(monkeypatch, tmp_path):
    """No tokenizer loaded yet in this process, and verdicts recorded under tmp_path."""
    monkeypatch.setattr(tokenizer, "_LOADED", {})
    monkeypatch.setattr(fast_tokenizer, "VERDICTS", str(tmp_path / "verdicts"))


def test_fastokens_gives_the_reference_ids_on_real_text(fresh_tokenizers, gpt2):
    tok = load_tokenizer(gpt2)
    assert tok.backend_name == "fastokens"
    texts = [r["text"] for r in kjv_records()[:3000]] + [d["text"] for d in python_source_documents(1 << 20)]
    ids, offsets = tok.encode_flat(texts)
    want = tok.encode_batch(texts)  # the reference, Hugging Face tokenizers
    assert [ids[a:b].tolist() for a, b in itertools.pairwise(offsets)] == want


def test_the_verdict_is_kept_and_not_probed_again(fresh_tokenizers, gpt2, monkeypatch):
    assert load_tokenizer(gpt2).fast.wait()
    monkeypatch.setattr(tokenizer, "_LOADED", {})

    def no_probing(*args):
        raise AssertionError("the recorded verdict must be used")

    monkeypatch.setattr(fast_tokenizer, "first_difference", no_probing)
    assert load_tokenizer(gpt2).fast.wait()


class _WrongFor:
    """A stand-in fast backend that gets one text wrong."""

    def __init__(self, real, text: str):
        self.real, self.text = real, text

    def encode_batch_flat(self, texts):
        ids, offsets = self.real.encode_batch_flat(texts)
        if self.text in texts:
            ids = bytes(4) + ids[4:]  # token 0 instead of the first id
        return ids, offsets


def test_a_difference_in_the_data_sample_turns_the_fast_backend_off(fresh_tokenizers, gpt2, caplog):
    tok = load_tokenizer(gpt2)
    assert tok.fast.wait()
    tok.fast.fast = _WrongFor(tok.fast.fast, "The odd one out")
    texts = ["The odd one out", "and the rest"]
    ids, offsets = tok.encode_flat(texts)
    assert ids[: offsets[1]].tolist() == tok.encode_batch(texts)[0], "the reference's ids, not the wrong ones"
    assert tok.backend_name == "tokenizers"
    assert "fastokens differs from tokenizers" in caplog.text
    key = tok.fast.key
    assert fast_tokenizer._verdict(key) is False, "recorded: later loads use the reference"


def test_probes_that_differ_keep_the_reference(fresh_tokenizers, gpt2, monkeypatch):
    monkeypatch.setattr(fast_tokenizer, "first_difference", lambda *args: "$#a")
    assert load_tokenizer(gpt2).backend_name == "tokenizers"
    monkeypatch.setattr(tokenizer, "_LOADED", {})
    assert load_tokenizer(gpt2).fast is None, "the recorded verdict: not even loaded again"


def test_until_the_fast_backend_is_loaded_the_reference_encodes(
    fresh_tokenizers, gpt2, monkeypatch, held_loading
):
    import threading

    gate = held_loading
    tok = load_tokenizer(gpt2)
    one_core = []
    real_one_thread = tok.encode_one_thread
    monkeypatch.setattr(
        tok, "encode_one_thread", lambda texts: (one_core.append(texts), real_one_thread(texts))[1]
    )
    texts = ["Loading, still", "and another"]  # small: the reference encodes them, no waiting
    ids, offsets = tok.encode_flat(texts)
    assert not tok.fast.ready.is_set() and ids[: offsets[1]].tolist() == tok.encode_batch(texts)[0]
    assert one_core == [texts], "on one core, leaving the other to the loading"
    big = [r["text"] for r in kjv_records()[:3000]]  # larger: waits for the fast backend
    assert sum(map(len, big)) > fast_tokenizer.FastBackend.small
    out = []
    waiting = threading.Thread(target=lambda: out.append(tok.fast.encode_flat(big, _no_reference)))
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive() and not out  # still waiting while the loading is held
    gate.set()
    waiting.join(60)
    ids, offsets = out[0]  # fastokens' answer
    assert [ids[a:b].tolist() for a, b in itertools.pairwise(offsets)] == tok.encode_batch(big)
    assert tok.backend_name == "fastokens"


def test_the_reference_on_one_core_gives_its_batched_ids(fresh_tokenizers, gpt2):
    tok = load_tokenizer(gpt2, backend="tokenizers")
    code = [d["text"] for d in python_source_documents(200_000, 20_000)]
    texts = [r["text"] for r in kjv_records()[:300]] + code + ["", " ", "a<|endoftext|>b"]
    assert len(code) > 5
    assert tok.encode_one_thread(texts) == tok.encode_batch(texts)
    ids, offsets = tok._flat_one_thread(texts)
    assert [ids[a:b].tolist() for a, b in itertools.pairwise(offsets)] == tok.encode_batch(texts)


def test_while_loading_the_reference_encodes_one_call_at_a_time(
    fresh_tokenizers, gpt2, monkeypatch, held_loading
):
    """Thread workers reading ahead must not put every chunk through the reference at once (and
    starve the loading of a core): a second caller waits for the reference's turn or for the
    fast backend, whichever comes first."""
    import threading

    gate = held_loading
    tok = load_tokenizer(gpt2)
    entered = {name: threading.Event() for name in ("first", "second", "third")}
    leave = {name: threading.Event() for name in entered}
    out = {}

    def reference(name):
        def encode(texts):
            entered[name].set()
            assert leave[name].wait(60)
            return tok._flat_one_thread(texts)

        return encode

    def call(name):
        texts = [f"a small chunk for the {name} caller"]
        threading.Thread(
            target=lambda: out.setdefault(name, tok.fast.encode_flat(texts, reference(name)))
        ).start()

    call("first")
    assert entered["first"].wait(10)
    call("second")
    assert not entered["second"].wait(0.5), "a second caller waits while the reference is busy"
    leave["first"].set()
    assert entered["second"].wait(10), "then it takes the reference's turn"
    call("third")
    assert not entered["third"].wait(0.5)
    gate.set()  # the fast backend is ready before the reference's turn comes
    assert tok.fast.wait(60)
    deadline = time.monotonic() + 10
    while "third" not in out and time.monotonic() < deadline:
        time.sleep(0.01)
    ids, _ = out["third"]  # fastokens' answer, while the second caller still holds the reference
    assert (
        not entered["third"].is_set()
        and ids.tolist() == tok.encode_batch(["a small chunk for the third caller"])[0]
    )
    leave["second"].set()
    deadline = time.monotonic() + 10
    while len(out) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    for name in ("first", "second"):
        assert (
            entered[name].is_set()
            and out[name][0].tolist() == tok.encode_batch([f"a small chunk for the {name} caller"])[0]
        )


def test_while_loading_the_reference_encodes_a_first_batch_s_worth_then_waits(
    fresh_tokenizers, gpt2, monkeypatch, held_loading
):
    """The reference's encoding slows the loading beside it: past ``small`` characters in all,
    callers wait for the fast backend instead."""
    import threading

    monkeypatch.setattr(fast_tokenizer.FastBackend, "small", 100)
    tok = load_tokenizer(gpt2)
    referenced = []
    monkeypatch.setattr(
        tok,
        "_flat_one_thread",
        lambda texts: (referenced.append(texts), tokenizer.flat(tok.encode_batch(texts)))[1],
    )
    first, second = (
        ["sixty characters of the first chunk, which the reference encodes."],
        ["and sixty more, past the budget: these wait for the fast backend."],
    )
    ids, _ = tok.encode_flat(first)
    assert referenced == [first] and ids.tolist() == tok.encode_batch(first)[0]
    out = []
    waiting = threading.Thread(target=lambda: out.append(tok.encode_flat(second)))
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive() and not out, "past the budget: it waits while the loading is held"
    held_loading.set()
    waiting.join(60)
    assert referenced == [first], "fastokens encoded the second call"
    assert out[0][0].tolist() == tok.encode_batch(second)[0]


@pytest.fixture
def held_after_a_verdict(fresh_tokenizers, gpt2, monkeypatch):
    """GPT-2 loaded once (its verdict recorded: the next load does not probe), then the next
    loading held as ``held_loading`` holds it."""
    assert load_tokenizer(gpt2).fast.wait()
    monkeypatch.setattr(tokenizer, "_LOADED", {})
    yield from _held(monkeypatch)


def _fast_built_as(monkeypatch, fast, texts: list[str] | None = None) -> None:
    """fastokens' build gives ``fast(the real one)``; each text it is given goes in ``texts``."""
    import fastokens

    build = fastokens.Tokenizer.from_json_str

    class Shim:
        @staticmethod
        def from_json_str(raw):
            if texts is not None:
                texts.append(raw)
            return fast(build(raw))

    monkeypatch.setattr(fastokens, "Tokenizer", Shim)


def test_the_texts_the_reference_encoded_while_loading_are_the_data_sample(
    gpt2, monkeypatch, held_after_a_verdict
):
    held_loading = held_after_a_verdict
    tok = load_tokenizer(gpt2)
    texts = [r["text"] for r in kjv_records()[:40]]
    ids, offsets = tok.encode_flat(texts)  # the reference's, while loading
    assert not tok.fast.ready.is_set() and len(tok.fast.seen) == 40

    def no_sampling(*args):
        raise AssertionError("the data sample was checked while loading: no reference encodes it now")

    monkeypatch.setattr(fast_tokenizer, "first_difference", no_sampling)
    held_loading.set()
    assert tok.fast.wait(60) and tok.fast.sampled and tok.fast.seen is None
    tok.fast._keep_seen(texts, ids, offsets)  # a reference call that ended after the loading
    assert tok.fast.seen is None, "nothing kept once the sample is checked"
    more = [r["text"] for r in kjv_records()[40:3000]]
    ids, offsets = tok.fast.encode_flat(more, _no_reference)
    assert [ids[a:b].tolist() for a, b in itertools.pairwise(offsets)] == tok.encode_batch(more)


def test_a_difference_in_what_the_reference_encoded_while_loading_turns_the_fast_backend_off(
    gpt2, monkeypatch, held_after_a_verdict, caplog
):
    held_loading = held_after_a_verdict
    _fast_built_as(monkeypatch, lambda real: _WrongFor(real, "The odd one out"))
    tok = load_tokenizer(gpt2)
    texts = ["and the first", "The odd one out", "and the rest"]
    ids, offsets = tok.encode_flat(texts)  # the reference's, while loading
    held_loading.set()
    assert not tok.fast.wait(60), "off before it served a call"
    assert tok.backend_name == "tokenizers" and "fastokens differs from tokenizers" in caplog.text
    assert fast_tokenizer._verdict(tok.fast.key) is False, "recorded: later loads use the reference"
    ids, offsets = tok.encode_flat(texts)
    assert [ids[a:b].tolist() for a, b in itertools.pairwise(offsets)] == tok.encode_batch(texts)


def test_batches_are_the_same_with_either_backend(fresh_tokenizers, corpus, gpt2, monkeypatch):
    def batches():
        ds = Dataset.from_path("synthetic", corpus, exhausted="repeat")
        p = Pipeline(ds).options(num_lanes=2, chunk_bytes=4096).tokenize(gpt2).pack_flat(64)
        return [b.digest() for b in drain(p.shuffle(8, seed=1).batch(2), 40)]

    tok = load_tokenizer(gpt2)  # the pipeline's thread workers share this process's tokenizer
    assert tok.fast.wait(), "fastokens loaded before the run, so that no chunk goes to the reference"
    encoded = []
    real = tok.fast.fast

    class Counting:
        def encode_batch_flat(self, texts):
            encoded.append(len(texts))
            return real.encode_batch_flat(texts)

    tok.fast.fast = Counting()
    fast = batches()
    assert len(encoded) >= 4, "fastokens encoded the chunks of the first run"
    monkeypatch.setattr(tokenizer, "_LOADED", {})
    monkeypatch.setattr(fast_tokenizer, "load", lambda raw: None)
    assert load_tokenizer(gpt2).backend_name == "tokenizers"
    assert batches() == fast
    assert np.unique(fast).size == 40


def test_the_data_sample_is_bounded_in_characters_not_only_in_documents():
    texts = ["x" * 10_000] * 300
    sample = fast_tokenizer.data_sample(texts)
    assert len(sample) == 16 and all(len(t) == 4096 for t in sample)  # 16 * 4 Ki = 64 Ki
    assert fast_tokenizer.data_sample(["a", "b"]) == ["a", "b"]


def test_a_broken_tokenizer_file_is_named_and_its_fast_loading_ends(fresh_tokenizers, gpt2, tmp_path):
    import shutil
    import threading

    broken = tmp_path / "broken"
    shutil.copytree(gpt2, broken)
    raw = (broken / "tokenizer.json").read_bytes()
    (broken / "tokenizer.json").write_bytes(raw[: len(raw) // 2])  # cut short, as by a full disk
    with pytest.raises(ValueError, match=r"tokenizer\.json: not a tokenizer Hugging Face"):
        load_tokenizer(str(broken))
    loading = [t for t in threading.enumerate() if t.name == "zephon-fastokens"]
    for t in loading:
        t.join(30)
    assert not any(t.is_alive() for t in loading), "the fast backend's loading must not wait forever"


def test_the_tokenizers_backend_does_not_load_fastokens_at_all(fresh_tokenizers, gpt2, monkeypatch):
    loads = []
    monkeypatch.setattr(fast_tokenizer, "load", lambda raw: loads.append(len(raw)))
    tok = load_tokenizer(gpt2, backend="tokenizers")
    assert tok.backend_name == "tokenizers" and tok.fast is None
    assert loads == [], "a worker's start would spend a third of a second of CPU on it for nothing"
    load_tokenizer(gpt2)
    assert len(loads) == 1


def test_hostile_texts_get_the_same_ids_from_both_backends_within_seconds(fresh_tokenizers, gpt2):
    import time

    tok = load_tokenizer(gpt2)
    assert tok.fast.wait(), "fastokens must be on, or this compares the reference with itself"
    for name, text in hostile_texts().items():
        began = time.perf_counter()
        ids, offsets = tok.fast.encode_flat([text, "after"], _no_reference)
        fast_s, began = time.perf_counter() - began, time.perf_counter()
        want = tok.encode_batch([text, "after"])  # the reference, Hugging Face tokenizers
        reference_s = time.perf_counter() - began
        assert [ids[a:b].tolist() for a, b in itertools.pairwise(offsets)] == want, name
        assert fast_s < 5 and reference_s < 5, f"{name}: {fast_s:.1f} s, {reference_s:.1f} s"
    special = tok.fast.encode_flat(["a<|endoftext|>b"], _no_reference)[0].tolist()
    assert special == tok.encode_batch(["a<|endoftext|>b"])[0] and 50256 in special, (
        "a special token inside text is that token, in both backends"
    )


def test_neither_backend_encodes_a_lone_surrogate(fresh_tokenizers, gpt2):
    # tokenize turns the failure into a bad record; were one backend to encode it, the
    # backends would give different ids
    tok = load_tokenizer(gpt2)
    assert tok.fast.wait()
    for text in ["a\ud800b", "\udfff", "x\ud83d"]:
        with pytest.raises((TypeError, UnicodeError)):
            tok.fast.encode_flat([text], _no_reference)
        with pytest.raises((TypeError, UnicodeError)):
            tok.encode_batch([text])


def _hostile_batches(path: str, gpt2: str, backend: str, runner: str = "inline", on_error: str = "skip"):
    ds = Dataset.from_path("hostile", path, on_error=on_error)
    p = Pipeline(ds).options(num_lanes=1, runner=runner).tokenize(tokenizer_id=gpt2, backend=backend)
    p = p.pack_flat(max_length=1024).batch(microbatch_size=4)
    try:
        return np.concatenate([b.tokens for b in p]), p.stats()
    finally:
        p.close()


@pytest.mark.slow  # waits on timeouts or servers by design: seconds
def test_hostile_records_make_the_same_batches_with_either_backend(
    fresh_tokenizers, gpt2, tmp_path, monkeypatch
):
    path = write_hostile_jsonl(str(tmp_path / "hostile.jsonl"))
    encoded, real = [], fast_tokenizer._flat
    monkeypatch.setattr(
        fast_tokenizer, "_flat", lambda fast, texts: (encoded.append(len(texts)), real(fast, texts))[1]
    )
    fast, fast_stats = _hostile_batches(path, gpt2, "auto")
    assert encoded, "fastokens must have encoded the chunks"
    encoded.clear()
    reference, stats = _hostile_batches(path, gpt2, "tokenizers")
    assert not encoded
    assert np.array_equal(fast, reference)
    assert stats == fast_stats and stats["counters"]["skipped_records"] == 2  # the lone surrogates
    assert stats["documents"]["hostile"] == 13
    assert fast.size > 3 << 20  # the megabyte runs are all there


@pytest.mark.parametrize("runner", ["inline", "process"])
@pytest.mark.parametrize("backend", ["auto", "tokenizers"])
def test_a_lone_surrogate_is_an_error_that_names_its_file_and_line(
    fresh_tokenizers, gpt2, tmp_path, backend, runner
):
    path = tmp_path / "surrogate.jsonl"
    path.write_text(
        '{"text": "fine"}\n{"text": "fine too"}\n{"text": "broken \\ud800 here"}\n{"text": "x"}\n'
    )
    with pytest.raises(
        ValueError, match=r"surrogate\.jsonl, line 3: .*lone surrogate U\+D800 at character 7"
    ):
        _hostile_batches(str(path), gpt2, backend, runner, on_error="raise")


def test_installed_versions_are_importlib_metadata_s_without_importing_it(tmp_path, monkeypatch):
    import importlib.metadata

    for package in ("fastokens", "tokenizers", "numpy", "msgspec"):
        __import__(package)
        assert fast_tokenizer.installed_version(package) == importlib.metadata.version(package), package
    # from the one dist-info folder beside the package; without one (an editable install), or with
    # two, importlib.metadata's answer
    (tmp_path / "zephon_fake_pkg").mkdir()
    (tmp_path / "zephon_fake_pkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("zephon_fake_pkg")
    monkeypatch.setattr(importlib.metadata, "version", lambda package: f"metadata's {package}")
    assert fast_tokenizer.installed_version("zephon_fake_pkg") == "metadata's zephon_fake_pkg"
    (tmp_path / "zephon_fake_pkg-1.2.3.dist-info").mkdir()
    assert fast_tokenizer.installed_version("zephon_fake_pkg") == "1.2.3"
    (tmp_path / "zephon_fake_pkg-1.2.4.dist-info").mkdir()
    assert fast_tokenizer.installed_version("zephon_fake_pkg") == "metadata's zephon_fake_pkg"
    sys.modules.pop("zephon_fake_pkg")


def _ids_of(fast, texts: list[str]) -> list[list[int]]:
    ids, offsets = fast_tokenizer._flat(fast, texts)
    return [ids[a:b].tolist() for a, b in itertools.pairwise(offsets)]


def test_the_fast_form_is_the_same_tokenizer_to_both_libraries(gpt2):
    import json

    import fastokens
    from tokenizers import Tokenizer

    with open(f"{gpt2}/tokenizer.json", "rb") as f:
        raw = f.read()
    form = fast_tokenizer.fast_form(raw)
    merges = json.loads(form)["model"]["merges"]
    assert len(merges) == 50_000 and all(isinstance(m, str) for m in merges), "merges as strings"
    assert json.loads(raw)["model"]["merges"][:3] == [m.split(" ") for m in merges[:3]]
    assert Tokenizer.from_str(form.decode()).to_str() == Tokenizer.from_str(raw.decode()).to_str(), (
        "tokenizers reads both as one tokenizer"
    )
    texts = [r["text"] for r in kjv_records()[:2000]] + [d["text"] for d in python_source_documents(1 << 19)]
    texts += fast_tokenizer.probes()
    built = [fastokens.Tokenizer.from_json_str(spec.decode()) for spec in (raw, form)]
    assert _ids_of(built[1], texts) == _ids_of(built[0], texts)


@pytest.mark.parametrize(
    "spec",
    [
        b'{"model": {"type": "BPE", "merges": [["a b", "c"]]}}',  # only a pair can say it
        b'{"model": {"type": "BPE", "merges": [["a", "c"], ["x", "y z"]]}}',
        b'{"model": {"type": "BPE", "merges": ["a c", "x y"]}}',  # strings already
        b'{"model": {"type": "BPE", "merges": [["a", "b", "c"]]}}',
        b'{"model": {"type": "BPE", "merges": [["a", 1]]}}',
        b'{"model": {"type": "BPE", "merges": []}}',
        b'{"model": {"type": "WordPiece", "vocab": {"a": 0}}}',
        b'{"model": "BPE"}',
        b"[1, 2]",
        b'{"model": {"type": "BPE", "merges": [["a", "c"]]',  # cut short
    ],
)
def test_no_fast_form_where_the_file_has_nothing_to_change_or_only_pairs_can_say_it(spec):
    assert fast_tokenizer.fast_form(spec) is None


def test_a_later_load_builds_fastokens_from_the_kept_fast_form(fresh_tokenizers, gpt2, monkeypatch):
    built = []
    _fast_built_as(monkeypatch, lambda real: real, built)
    first = load_tokenizer(gpt2).fast
    assert first.wait()
    first.loading.join(60)  # the form is kept after the loading, for the next
    with open(f"{gpt2}/tokenizer.json", "rb") as f:
        raw = f.read()
    assert fast_tokenizer._read(first.form_path) == fast_tokenizer.fast_form(raw)
    assert built == [fast_tokenizer.fast_form(raw).decode()], "the first load probed the form built"
    built.clear()
    monkeypatch.setattr(tokenizer, "_LOADED", {})
    tok = load_tokenizer(gpt2)
    assert tok.fast.wait() and tok.backend_name == "fastokens"
    assert built == [fast_tokenizer.fast_form(raw).decode()], "built from the kept form, once"
    texts = [r["text"] for r in kjv_records()[:3000]]
    assert _ids_of(tok.fast.fast, texts) == tok.encode_batch(texts)


def test_a_kept_form_fastokens_cannot_read_is_made_again(fresh_tokenizers, gpt2, monkeypatch, caplog):
    import logging

    first = load_tokenizer(gpt2).fast
    assert first.wait()
    first.loading.join(60)
    fast_tokenizer._write(first.form_path, b'{"model": {"type": "BPE", "vocab": ')  # as if damaged
    built = []
    _fast_built_as(monkeypatch, lambda real: real, built)
    monkeypatch.setattr(tokenizer, "_LOADED", {})
    with caplog.at_level(logging.INFO, logger="zephon.io.fast_tokenizer"):
        tok = load_tokenizer(gpt2)
        assert tok.fast.wait() and tok.backend_name == "fastokens"
    with open(f"{gpt2}/tokenizer.json", "rb") as f:
        raw = f.read()
    assert built[1:] == [fast_tokenizer.fast_form(raw).decode()], "then made again from the file"
    assert "cannot read its kept form" in caplog.text
    tok.fast.loading.join(60)
    assert fast_tokenizer._read(tok.fast.form_path) == fast_tokenizer.fast_form(raw), "and kept again"
    texts = [r["text"] for r in kjv_records()[:3000]]
    assert _ids_of(tok.fast.fast, texts) == tok.encode_batch(texts)


def test_a_file_with_nothing_to_change_is_kept_as_itself(fresh_tokenizers, gpt2, tmp_path, monkeypatch):
    import shutil

    strings = tmp_path / "strings"
    shutil.copytree(gpt2, strings)
    raw = (strings / "tokenizer.json").read_bytes()
    (strings / "tokenizer.json").write_bytes(fast_tokenizer.fast_form(raw))
    first = load_tokenizer(str(strings)).fast
    assert first.wait()
    first.loading.join(60)
    assert fast_tokenizer._read(first.form_path) == b"", "kept as 'the file as it is'"
    built = []
    _fast_built_as(monkeypatch, lambda real: real, built)
    monkeypatch.setattr(tokenizer, "_LOADED", {})
    assert load_tokenizer(str(strings)).fast.wait()
    assert built == [(strings / "tokenizer.json").read_text()]


def test_the_reference_begins_its_build_once_fastokens_is_inside_its_own(fresh_tokenizers, gpt2, monkeypatch):
    import tokenizers

    # the reference's build holds the GIL throughout: begun first, it kept the loading thread
    # from reaching fastokens' build (which lets go of it) for its whole length
    backends, at_reference = [], []
    real_load, real_read = fast_tokenizer.load, fast_tokenizer._read
    monkeypatch.setattr(fast_tokenizer, "load", lambda raw: backends.append(real_load(raw)) or backends[-1])
    monkeypatch.setattr(fast_tokenizer, "_read", lambda path: (time.sleep(0.3), real_read(path))[1])
    real_build = tokenizers.Tokenizer.from_str

    class Reference:
        @staticmethod
        def from_str(text):
            at_reference.append(backends[-1].building.is_set())
            return real_build(text)

    monkeypatch.setattr(tokenizers, "Tokenizer", Reference)
    tok = load_tokenizer(gpt2)
    assert at_reference == [True], "the reference waited for fastokens' build to begin"
    assert tok.fast.wait()


def test_the_reference_waits_at_most_a_second_for_fastokens_to_begin(fresh_tokenizers, gpt2, monkeypatch):
    real_read = fast_tokenizer._read
    monkeypatch.setattr(fast_tokenizer, "_read", lambda path: (time.sleep(6), real_read(path))[1])
    began = time.perf_counter()
    tok = load_tokenizer(gpt2)  # its loading stuck before its build (a slow disk)
    took = time.perf_counter() - began
    assert 0.9 < took < 4, f"{took:.1f} s"
    assert tok.encode_batch(["In the beginning"]) == [[818, 262, 3726]]
    assert tok.fast.wait(60)


def test_a_cache_write_that_fails_leaves_nothing_behind(tmp_path, monkeypatch, caplog):
    import logging
    import os

    def full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with caplog.at_level(logging.INFO, logger="zephon.io.fast_tokenizer"):
        fast_tokenizer._write(str(tmp_path / "cache" / "k.tokenizer.json"), b"{}")
    assert os.listdir(tmp_path / "cache") == [], "no half-written file left"
    assert "cannot keep" in caplog.text and "No space left" in caplog.text


def test_waiting_for_tokenizers_to_settle_follows_their_load_and_is_bounded(fresh_tokenizers, gpt2):
    import threading

    named = [(gpt2, "auto")]
    began = time.monotonic()
    assert tokenizer.wait_settled(named, 0.3) is False, "none loaded"
    assert 0.25 < time.monotonic() - began < 5
    assert tokenizer.wait_settled([], 0) is True
    said = []
    waiting = threading.Thread(target=lambda: said.append(tokenizer.wait_settled(named, 60)))
    waiting.start()
    time.sleep(0.2)  # waiting already when the load begins: it hears of it
    load_tokenizer(gpt2)
    began = time.monotonic()
    waiting.join(60)
    assert said == [True] and time.monotonic() - began < 30, "heard of at once, not at its 60 s"
    fast = tokenizer._LOADED[gpt2, "auto"].fast
    assert fast.ready.is_set() and fast.on, "settled: its fast backend ready"
    assert tokenizer.wait_settled([(gpt2, "tokenizers")], 0.2) is False, "another backend is another load"


def test_waiting_for_tokenizers_to_settle_waits_for_their_fast_backend(
    fresh_tokenizers, gpt2, monkeypatch, held_loading
):
    import threading

    load_tokenizer(gpt2)
    began = time.monotonic()
    assert tokenizer.wait_settled([(gpt2, "auto")], 0.3) is False, "its fast backend held"
    assert time.monotonic() - began < 5
    threading.Timer(0.2, held_loading.set).start()
    assert tokenizer.wait_settled([(gpt2, "auto")], 60) is True


def test_a_tokenizer_is_loading_while_its_fast_backend_loads(fresh_tokenizers, gpt2, held_loading):
    named = [(gpt2, "auto")]
    assert tokenizer.loading(named) is False, "not loaded at all: nothing loading"
    tok = load_tokenizer(gpt2)
    assert tokenizer.loading(named) is True, "its fast backend held"
    held_loading.set()
    assert tok.fast.wait(60)
    assert tokenizer.loading(named) is False
    assert tokenizer.loading([(gpt2, "tokenizers")]) is False
