"""A multi-node rehearsal on one machine (scripts/multinode_rehearsal.py): two torchrun launchers
as the two nodes of one job (4 ranks), its data in S3 (moto, every request logged), a checkpoint
at step 3 of 6, resumed on one node with 1 rank and with 4."""

from __future__ import annotations

from collections import Counter

import boto3
import pytest
from multinode_rehearsal import CHECKPOINT, STEPS, rehearse

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # 4 real torchrun starts: about 3 minutes


@pytest.fixture(scope="module")
def rehearsal(s3, tmp_path_factory):
    server, storage = s3
    endpoint = storage["client_kwargs"]["endpoint_url"]
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    return rehearse(str(tmp_path_factory.mktemp("nodes")), server, endpoint, client, echo=lambda line: None)


def _kinds(start) -> Counter:
    return Counter(r[0] for r in start.requests)


def test_every_step_resumed_on_one_node_with_1_or_4_ranks_trains_on_the_two_node_runs_global_batch(
    rehearsal,
):
    nodes = rehearsal.nodes
    assert nodes.dp == {4} and sorted(nodes.digests) == list(range(1, STEPS + 1))
    assert len(set(nodes.digests.values())) == STEPS
    for ngpu, resumed in rehearsal.resumed.items():
        assert resumed.dp == {ngpu}
        assert resumed.digests == {s: nodes.digests[s] for s in range(CHECKPOINT + 1, STEPS + 1)}, ngpu


def test_the_two_node_start_asks_the_store_for_one_plan_not_one_per_rank(rehearsal):
    plan, nodes = rehearsal.plan, rehearsal.nodes
    assert _kinds(plan) == {"list": 2, "head": 1, "footer": 4}  # one plan: a listing, each footer
    assert nodes.planned
    assert nodes.first(len(plan.requests)) == plan.first(len(plan.requests))
    assert (_kinds(nodes)["list"], _kinds(nodes)["head"]) == (2, 1)  # nobody else listed


def test_a_restart_on_1_or_4_ranks_only_lists_the_files_before_reading_chunks(rehearsal):
    listing = rehearsal.listing()
    for ngpu, resumed in rehearsal.resumed.items():
        assert not resumed.planned, ngpu  # the saved plan, checked against the listing
        assert resumed.first(len(listing)) == rehearsal.plan.first(len(listing)), ngpu
        kinds = _kinds(resumed)
        assert (kinds["list"], kinds["head"]) == (2, 1), ngpu
        # after the listing: chunks, and each process's footer reads (at most one per file)
        assert kinds["footer"] <= ngpu * 4 and kinds["read"] > 0, ngpu
