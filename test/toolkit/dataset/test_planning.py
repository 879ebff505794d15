"""The epoch's partition (toolkit/dataset/planning.py): planned batches, their dealing to ranks and workers, and the
shares of an epoch that is not planned."""
import hashlib
import json
from collections import Counter

import pytest
import yaml

from toolkit.dataset import build_dataset, resolve_dataset_conf
from toolkit.dataset.data_list import make_raw_list, write_raw_list
from toolkit.dataset.planning import deal_batches, plan_batches

from test.helpers import REPO_ROOT



def test_planned_batches_are_sorted_runs_and_the_dealing_evens_out_the_ranks():
    conf = resolve_dataset_conf({"batch_conf": {"batch_size": 8}, "sort_conf": {"sort_size": 20}})
    frames = [(i * 37) % 101 for i in range(50)]
    order = list(range(50))[::-1]
    batches = plan_batches(order, frames, conf)
    # runs of 20, 20 and 10 lines, each sorted by length and cut into batches of 8: 8 8 4 | 8 8 4 | 8 2
    assert [len(b) for b in batches] == [8, 8, 4, 8, 8, 4, 8, 2]
    runs = [order[:20], order[20:40], order[40:]]
    assert [i for b in batches[:3] for i in b] == sorted(runs[0], key=lambda i: frames[i])
    assert sorted(i for b in batches for i in b) == list(range(50))
    # the recipe's training set: 6,016 lines in batches of 8, sort runs of 500: the ranks end one batch apart, and
    # at most two batches' lines apart (the short batches of 4 fall unevenly)
    sizes = [len(b) for b in plan_batches(list(range(6016)), [100] * 6016, resolve_dataset_conf(
        {"batch_conf": {"batch_size": 8}, "sort_conf": {"sort_size": 500}}))]
    assert sum(sizes) == 6016 and sizes.count(4) == 12 and set(sizes) == {8, 4}
    for world_size in range(1, 17):
        loads, counts = Counter(), Counter()
        for size, rank in zip(sizes, deal_batches(sizes, world_size)):
            loads[rank] += size
            counts[rank] += 1
        assert len(loads) == world_size and max(counts.values()) - min(counts.values()) <= 1
        assert max(loads.values()) - min(loads.values()) <= 16
    assert deal_batches([8, 8, 8, 8, 2], 2) == [0, 1, 0, 1, 0] and deal_batches([496, 8, 8], 2) == [0, 1, 1]
    # Bucket batching mixes batch sizes: dealt by batches first, the ranks still end one batch apart (dealt by lines,
    # rank 0 would hold the 32-line batch alone while rank 1 got four, and the join would drop three of them).
    assert deal_batches([32, 8, 8, 8, 8], 2) == [0, 1, 1, 0, 1]
    mixed = [32, 8, 8, 8, 32, 8, 32, 32, 8, 8, 5] * 30
    for world_size in range(1, 17):
        counts = Counter(deal_batches(mixed, world_size))
        assert len(counts) == world_size and max(counts.values()) - min(counts.values()) <= 1
    # Static batches without sorting: the order cut as it is. Buckets: by length, shortest partial bucket first.
    unsorted = resolve_dataset_conf({"sort": False, "batch_conf": {"batch_size": 8}})
    assert plan_batches(list(range(20)), frames, unsorted) == [list(range(8)), list(range(8, 16)), [16, 17, 18, 19]]
    bucket = resolve_dataset_conf({"batch_conf": {"batch_type": "bucket", "bucket_boundaries": [50],
                                                  "bucket_batch_sizes": [4, 2]}})
    planned = plan_batches(list(range(10)), frames, bucket)
    assert all(len({frames[i] > 50 for i in b}) == 1 for b in planned) and sorted(sum(planned, [])) == list(range(10))


RECIPE = yaml.safe_load(open(REPO_ROOT / "examples/english/s0/conf/train_conformer.yaml",
                             encoding="utf-8"))["dataset_conf"]
CONFS = {"recipe": RECIPE,
         "bucket": {**RECIPE, "batch_conf": {"batch_type": "bucket", "bucket_boundaries": [300, 600],
                                             "bucket_batch_sizes": [32, 16, 8]}},
         "unsorted": {**RECIPE, "sort": False},
         "dynamic": {**RECIPE, "batch_conf": {"batch_type": "dynamic", "max_frames_in_batch": 4000}}}

# What AsrDataset.parts gave (then named chunks) at commit 97f0a32, before planning and dealing moved out of
# pipeline.py: (list, dataset_conf, mode) -> sha256 prefix of its parts (see partitions_digest). A change here
# changes every planned batch, or its rank or worker, of a training run and of its mid-epoch resumes.
PARTITIONS = {
    ("recipe", "recipe", "train"): "63aa1c1aaa3c7312",
    ("recipe", "bucket", "train"): "8e2ea1ffc0f9f97c",
    ("recipe", "recipe", "cv"): "7a60059651980bdc",
    ("tiny_fsdd", "recipe", "train"): "0ef5007e4d7dbda4",
    ("tiny_fsdd", "bucket", "train"): "0c3ad0c675ba2609",
    ("tiny_fsdd", "unsorted", "train"): "e71c5bc8071ad68f",
    ("tiny_fsdd", "dynamic", "train"): "20d6260403932dcb",
    ("tiny_fsdd", "recipe", "cv"): "28f82775805ed17b",
}


@pytest.fixture(scope="module")
def data_lists(tmp_path_factory):
    """Raw lists: the recipe's training set (the train splits of the four shipped corpora, sorted by key as
    local/prepare_data.sh sorts them; 6,016 lines) and tiny_fsdd's (80 lines)."""
    folder = tmp_path_factory.mktemp("lists")
    lists = {}
    for name, corpora in (("recipe", ["speechocean762", "kathleen", "ljspeech", "fsdd"]), ("tiny_fsdd", ["tiny_fsdd"])):
        entries = []
        for corpus in corpora:
            split = REPO_ROOT / "corpora" / corpus / "data" / "train"
            entries += make_raw_list(str(split / "wav.scp"), str(split / "text"),
                                     str(REPO_ROOT / "corpora" / corpus))[0]
        lists[name] = str(folder / f"{name}.list")
        write_raw_list(sorted(entries, key=lambda entry: entry["key"].encode()), lists[name])
    return lists


def partitions_digest(dataset) -> str:
    """sha256 prefix of the dataset's parts for two seeds, four (world size, loader workers) setups and two epochs."""
    parts = []
    for seed in (777, 3):
        for world_size, num_workers in ((1, 0), (2, 2), (3, 1), (8, 4)):
            dataset.seed, dataset.world_size = seed, world_size  # the same lines and header lengths, read once
            parts += [dataset.parts(epoch, num_workers) for epoch in (0, 3)]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


@pytest.mark.parametrize("data, conf, mode", PARTITIONS)
def test_the_planned_batches_their_dealing_and_the_shares_are_unchanged(data_lists, data, conf, mode):
    dataset = build_dataset(data_lists[data], None, CONFS[conf], mode=mode)  # parts read no audio, no text
    assert dataset.planned_batching == (mode == "train" and conf != "dynamic")
    assert partitions_digest(dataset) == PARTITIONS[data, conf, mode]
