"""``python -m zephon.torchtitan.check --job train_configs/NAME.toml --world-size N [--section.field v ...]``

The launch checks of a job, run before torchrun starts a process: the ones the trainer's config
makes before step 1 (zephon.torchtitan.job ``finish``), with the world size torchrun will make
(``NGPU`` processes per node). The DP size divides the recipe's ``num_lanes``, the global batch
splits across the lanes, the tokenizer fits the model's vocabulary, the recipe's context length
is ``training.seq_len``, the packing rules hold and the model's attention masks documents where
the recipe asks; the job config, the recipe and ``skip_steps`` parse. run_train.sh runs it
first, so a job that cannot start says why in the last lines of its output, in about a second
(zephon.torchtitan.jobview: no TorchTitan import), not in the middle of every rank's traceback
followed by torchrun's summary.

Exit status 0: the job may start (one line says what it will be); 1: the error, with what to
change; 2: a usage error.
"""

from __future__ import annotations

import argparse
import logging
import sys

from zephon.torchtitan.checks import check_attention, check_batch_geometry, check_context_length, check_vocab
from zephon.torchtitan.jobfile import batch_rows, data_parallel_size
from zephon.torchtitan.jobview import JobView, read
from zephon.torchtitan.recipe import check_packing, load_recipe
from zephon.torchtitan.skips import parse_skip_steps

PROG = "python -m zephon.torchtitan.check"


def check(view: JobView, world_size: int) -> str:
    """Raise the ValueError the trainer would raise at launch; else say what the job will be."""
    if view.loader != "zephon":  # TorchTitan's own loader, for comparisons: nothing of zephon's
        return f"zephon: {view.path}: TorchTitan's own loader ([data] loader = {view.loader!r})"
    parse_skip_steps(view.skip_steps)
    recipe = load_recipe(view.recipe, view.overrides)
    check_context_length(recipe, view.training.seq_len)
    check_packing(recipe, view.training.seq_len)
    check_attention(view.attention, recipe.document_mask)
    from zephon.io.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(recipe.tokenizer_id)
    check_vocab(tokenizer.vocab_size, view.vocab_size, recipe.tokenizer_id)
    dp = data_parallel_size(view.parallelism, world_size)
    rows = batch_rows(view.parallelism, view.training)
    per_lane = check_batch_geometry(
        num_lanes=recipe.num_lanes,
        dp_world_size=dp,
        local_batch_size=rows,
        global_batch_size=view.training.global_batch_size,
    )
    batches = f"{per_lane} batch{'es' if per_lane > 1 else ''}"
    return (
        f"zephon: {view.path} on {world_size} processes: DP {dp}, {recipe.num_lanes // dp} of "
        f"{recipe.num_lanes} lanes per rank, {batches} of {rows} rows per lane per step; recipe "
        f"{view.recipe}; outputs in {view.dump_folder}"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n\n")[1], allow_abbrev=False, add_help=False
    )
    parser.add_argument("--job", required=True, help="the job config (train_configs/NAME.toml)")
    parser.add_argument("--world-size", type=int, required=True, help="processes in the job (NGPU x nodes)")
    if {"-h", "--help"} & set(argv):
        if not any(a == "--job" or a.startswith("--job=") for a in argv):
            parser.print_help()
        return 0  # from run_train.sh (./run_train.sh --help): the trainer prints its own help next
    args, overrides = parser.parse_known_args(argv)
    if args.world_size < 1:
        parser.error(f"--world-size {args.world_size}: at least 1")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        line = check(read(args.job, overrides), args.world_size)
    except ValueError as e:
        print(f"zephon: the job cannot start ({args.job}, {args.world_size} processes):", file=sys.stderr)
        print(f"  {e}", file=sys.stderr)
        return 1
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
