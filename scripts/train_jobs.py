"""TorchTitan jobs as a user runs them (``run_train.sh`` under torchrun), for tests and figures.

Runs in a source checkout (it is not part of the installed package): ``ROOT`` is the repository,
with ``run_train.sh`` and the job configs. Scripts import it from their own folder; the tests
find it through ``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "train_configs/llama3_debug.toml"


def run_train(
    ngpu: int, dump: str, *args: str, config: str = CONFIG, timeout: int | None = 600
) -> tuple[int, str]:
    """``NGPU=ngpu CONFIG_FILE=config ./run_train.sh --dump_folder dump *args``: (exit code, output)."""
    env = dict(os.environ, NGPU=str(ngpu), CONFIG_FILE=config)
    cmd = ["./run_train.sh", "--dump_folder", dump, "--metrics.disable_color_printing", *args]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    return result.returncode, result.stdout + result.stderr


def run_train_nodes(
    nnodes: int, ngpu: int, dump: str, *args: str, config: str = CONFIG, timeout: int | None = 600
) -> tuple[list[int], list[str]]:
    """``nnodes`` launchers of ``run_train.sh`` on this machine, as ``nnodes`` nodes of one job
    (``NNODES``, ``NODE_RANK``, a rendezvous on 127.0.0.1 at a free port, gloo on the loopback
    interface): (each node's exit code, each node's output)."""
    env = dict(os.environ, NGPU=str(ngpu), CONFIG_FILE=config, NNODES=str(nnodes), GLOO_SOCKET_IFNAME="lo")
    env["RDZV_ENDPOINT"] = f"127.0.0.1:{free_port()}"
    cmd = ["./run_train.sh", "--dump_folder", dump, "--metrics.disable_color_printing", *args]
    deadline = None if timeout is None else time.monotonic() + timeout
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in range(nnodes)]  # never blocks
        nodes = [_launch(cmd, dict(env, NODE_RANK=str(rank)), logs[rank]) for rank in range(nnodes)]
        try:
            for node in nodes:
                node.wait(timeout=None if deadline is None else max(deadline - time.monotonic(), 0.1))
        finally:
            for node in nodes:  # a node that timed out, or whose peer did, takes its ranks down with it
                if node.poll() is None:
                    os.killpg(node.pid, signal.SIGTERM)
                    node.wait()
        outputs = []
        for log in logs:
            log.seek(0)
            outputs.append(log.read())
    return [node.returncode for node in nodes], outputs


def _launch(cmd: list[str], env: dict, log) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def digest_lines(dump: str) -> list[dict]:
    """The job's ``batch_digests.jsonl``: ``{"step", "digest", "dp"}`` per step (plus ``"data_step"``
    where a skipping run trained on another step's data), every run appended."""
    path = os.path.join(dump, "batch_digests.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def by_step(lines: list[dict]) -> dict[int, str]:
    return {line["step"]: line["digest"] for line in lines}


def default_loader_config(path: str, config: str = CONFIG) -> str:
    """A copy of ``config`` that trains on the same data with TorchTitan's own text loader."""
    with open(os.path.join(ROOT, config)) as f:
        text = f.read()
    recipe = 'recipe = "zephon_recipes/debug.toml"'
    if recipe not in text:
        raise ValueError(f"{config} does not use the debug recipe")
    default = recipe + '\nloader = "torchtitan"\ndataset_path = "assets/debug_corpus"'
    with open(path, "w") as f:
        f.write(text.replace(recipe, default))
    return path


def recipe_copy(folder: str, **changes: str) -> str:
    """The debug recipe in ``folder``, with absolute asset paths and lines ``old`` -> ``new``."""
    with open(os.path.join(ROOT, "zephon_recipes", "debug.toml")) as f:
        text = f.read().replace('"../assets', f'"{ROOT}/assets')
    for old, new in changes.items():
        if old not in text:
            raise ValueError(f"the debug recipe has no line {old!r}")
        text = text.replace(old, new)
    path = os.path.join(folder, "recipe.toml")
    with open(path, "w") as f:
        f.write(text)
    return path


def draw_barcode(ax, rows: dict[str, dict[int, bool]], steps: int, xlabel: str) -> None:
    """One row of cells per label: green where that step's global batch is the same, red not."""
    import matplotlib.pyplot as plt

    for y, same_by_step in enumerate(rows.values()):
        for s, same in same_by_step.items():
            ax.add_patch(
                plt.Rectangle((s - 0.45, y - 0.4), 0.9, 0.8, color="tab:green" if same else "tab:red")
            )
    ax.set_yticks(list(range(len(rows))), list(rows))
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlim(0.5, steps + 0.5)
    ax.set_xlabel(xlabel)
