"""The ``zephon`` command (pyproject.toml ``[project.scripts]``), beside ``python -m``::

zephon plan --job train_configs/NAME.toml [--steps N]       # zephon.torchtitan.plan: a dry run
zephon replay --job train_configs/NAME.toml --step 7        # zephon.torchtitan.replay
zephon check --job train_configs/NAME.toml --world-size 2   # zephon.torchtitan.check
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "plan": ("zephon.torchtitan.plan", "plan a job's data and estimate it, without training"),
    "replay": ("zephon.torchtitan.replay", "print (and save) the global batch of one step"),
    "check": ("zephon.torchtitan.check", "a job's launch checks, before torchrun starts"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        usage = "\n".join(f"  zephon {name:<7} {what}" for name, (_, what) in COMMANDS.items())
        print(f"usage: zephon {{{','.join(COMMANDS)}}} ... (--help after one for its options)\n{usage}",
              file=sys.stderr)  # fmt: skip
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    return importlib.import_module(COMMANDS[argv[0]][0]).main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
