"""Imported by the process runner's fork server before it forks any worker: it loads the tokenizers
the workers will encode with fastokens, so that every worker forked from it starts with them
loaded and probed (their pages shared) instead of loading its own. GPT-2 with its fast backend is
about 0.4 s of CPU and 100 MiB a load; two workers on two cores loaded theirs while the rank
process loaded its own and ran the first units, so a short run spent more CPU loading tokenizers
than tokenizing (two process workers, side by side: 8M tokens 5.71M tokens/s against 5.20M; 60M
tokens of the corpus 23.3M against 19.6M once started).

The runner names them in ``ENV`` (JSON ``[[tokenizer_id, backend], ...]``) in the environment the
server starts with (``zephon.runners.process._start_server``): at once where the loader is
warmed up (``Pipeline.warm_up``) or where it imports modules for the work (torch), else once the
rank process's own tokenizers are ready (else it loads none, and each worker loads its own). A
tokenizer that does not load here is left to each worker, which loads it as before and reports
what is wrong.
"""

from __future__ import annotations

import json
import logging
import os

from zephon.runners.process import PRELOAD_TOKENIZERS as ENV

LOADING = 120.0  # seconds the server waits for a fast backend to load and be probed
log = logging.getLogger(__name__)


def load_all(named: str) -> list[tuple[str, str]]:
    """Load every tokenizer ``named`` (as ``ENV`` holds them); the ones loaded and ready."""
    from zephon.io import tokenizer

    wanted = json.loads(named or "[]")
    if wanted:  # no thread pool of Hugging Face tokenizers in a process that forks: probing with
        # it here would make every worker warn and turn its parallelism off (they use one thread)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        # and fastokens' threads as its workers will have them (zephon.runners.process._install):
        # it reads them at its first encode, here (probes, its warm-up), whose state they inherit
        for name in ("FASTOKENS_BPE_THREADS", "RAYON_NUM_THREADS"):
            os.environ.setdefault(name, "1")
    loaded = []
    for tokenizer_id, backend in wanted:
        try:
            tok = tokenizer.load_tokenizer(tokenizer_id, backend)
        except Exception as e:  # each worker loads it, and its first unit says what is wrong
            log.info("zephon: the fork server could not load tokenizer %r (%s)", tokenizer_id, e)
            continue
        fast = getattr(tok, "fast", None)
        if fast is not None:
            fast.loading.join(LOADING)  # loaded and probed (the thread ends once it says so)
            if fast.loading.is_alive():
                log.warning("zephon: the fork server's fastokens load of %r did not end in %.0f s; "
                            "each worker loads its own", tokenizer_id, LOADING)  # fmt: skip
        if fast is None or fast.loading.is_alive() or not fast.wait(0):
            # still loading: a worker forked now would get it half made, without the thread that
            # makes it. No fast backend: Hugging Face tokenizers alone load in a tenth of a second,
            # and two workers that inherited them used 10-15% more CPU per token than two that
            # loaded their own (4M tokens, three interleaved comparisons; the cause not found, and
            # later runs without inheriting still differed by 6-8%): each loads its own, as before
            with tokenizer._LOCK:
                tokenizer._LOADED.pop((tokenizer_id, backend), None)
            continue
        loaded.append((tokenizer_id, backend))
    return loaded


try:
    load_all(os.environ.pop(ENV, ""))
except Exception as e:  # never stop the fork server: the workers load what they need
    log.info("zephon: the fork server's preload failed (%s)", e)
