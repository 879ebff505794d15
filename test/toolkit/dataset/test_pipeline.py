import itertools
import json
import logging
import re
from collections import Counter

import numpy as np
import pytest
import soundfile as sf
import torch
import yaml

from toolkit.dataset import processor, resolve_dataset_conf
from toolkit.dataset.conf import FbankConf
from toolkit.dataset.loader import build_dataloader
from toolkit.dataset.pipeline import build_dataset
from toolkit.utils.config_parsing import ConfigError

from test.helpers import REPO_ROOT, kaldi_entries

FSDD = REPO_ROOT / "corpora/tiny_fsdd"
LJ = REPO_ROOT / "corpora/tiny_lj"


def write_list(path, entries):
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return str(path)


def batches_of(data_list, tokenizer, conf: dict, **kwargs) -> list:
    """Every batch of one pass over ``data_list`` with ``conf`` (a partial dataset_conf)."""
    return list(build_dataloader(build_dataset(data_list, tokenizer, conf, **kwargs)))


def collect(loader):
    keys, skipped = [], Counter()
    for batch in loader:
        keys += batch["keys"]
        skipped.update(batch["num_skipped"])
    return keys, skipped


def test_partition_two_ranks_two_workers_each_key_once(tmp_path, tokenizer):
    entries = [e for e in kaldi_entries(FSDD, "train") if "Z" not in e["txt"]][:15]  # odd count
    data_list = write_list(tmp_path / "data.list", entries)
    conf = {"batch_conf": {"batch_size": 3}, "shuffle_conf": {"shuffle_size": 4}, "sort_conf": {"sort_size": 4},
            "dataloader_conf": {"num_workers": 2, "prefetch_factor": 2}}
    datasets = [build_dataset(data_list, tokenizer, conf, rank=r, world_size=2)
                for r in range(2)]
    orders = []
    for epoch in range(2):
        per_rank = []
        for dataset in datasets:
            dataset.set_epoch(epoch)
            keys, skipped = collect(build_dataloader(dataset))
            assert not skipped
            per_rank.append(keys)
        all_keys = per_rank[0] + per_rank[1]
        assert sorted(all_keys) == sorted(e["key"] for e in entries)
        # runs of 4 sorted lines make batches of 3 + 1 (3 1 3 1 3 1 3), each to the rank with fewer lines so far
        assert {len(k) for k in per_rank} == {7, 8}
        orders.append(per_rank)
    assert orders[0] != orders[1]
    assert set(orders[0][0]) != set(orders[1][0])  # the epoch permutation moves lines across ranks


def test_persistent_workers_still_reshuffle(tmp_path, tokenizer):
    entries = [e for e in kaldi_entries(FSDD, "dev") if "Z" not in e["txt"]]
    data_list = write_list(tmp_path / "data.list", entries)
    conf = {"sort": False, "batch_conf": {"batch_size": 4},
            "dataloader_conf": {"num_workers": 1, "persistent_workers": True, "prefetch_factor": 2}}
    dataset = build_dataset(data_list, tokenizer, conf)
    loader = build_dataloader(dataset)
    first, second = collect(loader)[0], collect(loader)[0]
    assert sorted(first) == sorted(second) == sorted(e["key"] for e in entries)
    assert first != second


def test_cv_mode_is_deterministic_without_augmentation(tmp_path, tokenizer):
    entries = kaldi_entries(LJ, "dev")
    data_list = write_list(tmp_path / "data.list", entries)
    conf = {"sort": False, "dataloader_conf": {"num_workers": 0}}
    dataset = build_dataset(data_list, tokenizer, conf, mode="cv")
    dataset.set_epoch(0)
    (first,) = list(build_dataloader(dataset))
    dataset.set_epoch(1)
    (second,) = list(build_dataloader(dataset))
    assert first["keys"] == second["keys"] == [e["key"] for e in entries]
    assert torch.equal(first["feats"], second["feats"])  # no dither, no SpecAugment
    assert not (first["feats"][0, :first["feats_lengths"][0]] == 0).any()
    assert first["feats"].dtype == torch.float32 and first["feats"].shape[2] == 80
    assert first["target_lengths"].tolist() == [len(e["txt"]) for e in entries]


def test_spec_aug_masks_training_features_from_its_start_epoch_on(tmp_path, tokenizer):
    # Real speech has no fbank value of exactly 0 (dither off here), so a band of zeros inside an utterance's
    # frames is a SpecAugment mask: none in epochs before start_epoch, some in every utterance from it on.
    entries = kaldi_entries(LJ, "dev")
    data_list = write_list(tmp_path / "data.list", entries)
    conf = {"sort": False, "shuffle": False, "fbank_conf": {"dither": 0.0}, "dataloader_conf": {"num_workers": 0},
            "spec_aug": True, "spec_aug_conf": {"num_t_mask": 1, "num_f_mask": 1, "max_t": 20, "max_f": 10,
                                                "start_epoch": 2}}
    dataset = build_dataset(data_list, tokenizer, conf, mode="train")
    masked = []
    for epoch in range(4):
        dataset.set_epoch(epoch)
        (batch,) = list(build_dataloader(dataset))
        masked.append([bool((feat[:length] == 0).any()) for feat, length in zip(batch["feats"],
                                                                                 batch["feats_lengths"])])
    assert masked == [[False] * len(entries)] * 2 + [[True] * len(entries)] * 2


def _bad_inputs(tmp_path):
    """Three good utterances, and bad ones with the reason training skips each: ``(good, bad, data_list)``."""
    good = [e for e in kaldi_entries(FSDD, "test") if "Z" not in e["txt"]][:3]
    lj_long = kaldi_entries(LJ, "train")[0]  # 9.7 s, over max_length below
    speech, rate = sf.read(FSDD / "wav/george-0-00.wav", dtype="float32")
    sf.write(tmp_path / "short.wav", speech[1000:1800], rate)  # 5 frames of real speech
    sf.write(tmp_path / "empty.wav", np.zeros(0, dtype=np.float32), rate)
    (tmp_path / "corrupt.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk" * 8)
    bad = [
        ({"key": "bad-missing", "wav": str(tmp_path / "nope.wav"), "txt": "ONE"}, "missing_audio"),
        ({"key": "bad-corrupt", "wav": str(tmp_path / "corrupt.wav"), "txt": "ONE"}, "unreadable_audio"),
        ({"key": "bad-empty-audio", "wav": str(tmp_path / "empty.wav"), "txt": "ONE"}, "empty_audio"),
        ({"key": "bad-empty-text", "wav": good[0]["wav"], "txt": " "}, "empty_text"),
        ({"key": "bad-unk", "wav": good[0]["wav"], "txt": "ZERO"}, "unknown_token"),
        ({"key": "bad-all-unk", "wav": good[0]["wav"], "txt": "ZZ QZ"}, "all_unknown"),
        ({"key": "bad-many-tokens", "wav": good[0]["wav"], "txt": "ONE TWO THREE FOUR"}, "too_many_tokens"),
        ({"key": "bad-short", "wav": str(tmp_path / "short.wav"), "txt": "ONE"}, "too_short"),
        (dict(lj_long, key="bad-long"), "too_long"),
    ]
    entries = [e for pair in zip(good, [b for b, _ in bad[:3]]) for e in pair] + [b for b, _ in bad[3:]]
    return good, bad, write_list(tmp_path / "data.list", entries)


BAD_INPUT_CONF = {"filter_conf": {"max_length": 500, "token_max_length": 10}, "batch_conf": {"batch_size": 2},
                  "dataloader_conf": {"num_workers": 0}}


def test_every_bad_input_is_skipped_named_and_counted(tmp_path, tokenizer, caplog):
    good, bad, data_list = _bad_inputs(tmp_path)
    with caplog.at_level(logging.WARNING):
        batches = batches_of(data_list, tokenizer, BAD_INPUT_CONF)
    keys = [k for b in batches for k in b["keys"]]
    assert sorted(keys) == sorted(e["key"] for e in good)
    total = Counter()
    for b in batches:
        total.update(b["num_skipped"])
    assert total == Counter(reason for _, reason in bad)
    for entry, reason in bad:
        assert any(entry["key"] in r.getMessage() and reason in r.getMessage() for r in caplog.records)


def test_test_mode_decodes_whatever_the_transcript_and_length(tmp_path, tokenizer):
    # Decoding (issue 45): the transcript is the score's reference, so an empty one, one of unknown units or one over
    # token_max_length, and the clips outside filter_conf's lengths, all come out; only unreadable audio is skipped.
    good, bad, data_list = _bad_inputs(tmp_path)
    batches = batches_of(data_list, tokenizer, BAD_INPUT_CONF, mode="test")
    keys = [k for b in batches for k in b["keys"]]
    audio_skips = ("missing_audio", "unreadable_audio", "empty_audio")
    assert sorted(keys) == sorted([e["key"] for e in good] + [b["key"] for b, r in bad if r not in audio_skips])
    assert sum((Counter(b["num_skipped"]) for b in batches), Counter()) == Counter(audio_skips)
    assert all(b["target"].shape == (len(b["keys"]), 0) and not b["target_lengths"].any() for b in batches)
    # a clip over filter_conf.max_length (970 frames > 500) is decoded in a batch of its own: 2 x 970 would pad past
    # batch_size x max_length
    assert [b["keys"] for b in batches if "bad-long" in b["keys"]] == [["bad-long"]]
    assert max(len(b["keys"]) for b in batches) == 2
    cv_keys = [k for b in batches_of(data_list, tokenizer, BAD_INPUT_CONF, mode="cv") for k in b["keys"]]
    assert sorted(cv_keys) == sorted(e["key"] for e in good)  # cross-validation computes a loss: it filters


def test_worker_with_only_bad_samples_yields_empty_batch_with_counts(tmp_path, tokenizer):
    entries = [{"key": f"gone-{i}", "wav": str(tmp_path / f"gone-{i}.wav"), "txt": "ONE"} for i in range(3)]
    data_list = write_list(tmp_path / "data.list", entries)
    conf = {"dataloader_conf": {"num_workers": 1, "prefetch_factor": 2}}
    (batch,) = batches_of(data_list, tokenizer, conf)
    assert batch["keys"] == [] and batch["num_skipped"] == {"missing_audio": 3}
    assert batch["feats"].shape == (0, 0, 80) and batch["feats_lengths"].shape == (0,)


def test_dynamic_batches_through_pipeline(tmp_path, tokenizer):
    entries = [e for e in kaldi_entries(FSDD, "train") if "Z" not in e["txt"]][:20]
    data_list = write_list(tmp_path / "data.list", entries)
    conf = {"batch_conf": {"batch_type": "dynamic", "max_frames_in_batch": 400},
            "dataloader_conf": {"num_workers": 0}}
    batches = batches_of(data_list, tokenizer, conf)
    assert sum(len(b["keys"]) for b in batches) == 20
    for b in batches:
        assert b["feats"].shape[0] * b["feats"].shape[1] <= 400
        assert b["feats"].shape[1] == b["feats_lengths"].max()


def test_conf_rejects_unknown_keys():
    with pytest.raises(ConfigError, match=r"'fbank'.*fbank_conf"):
        resolve_dataset_conf({"fbank": {}})
    with pytest.raises(ValueError, match=r"'num_mel'.*num_mel_bins"):
        resolve_dataset_conf({"fbank_conf": {"num_mel": 40}})
    with pytest.raises(ValueError, match="batch_type"):
        resolve_dataset_conf({"batch_conf": {"batch_type": "buckets"}})
    with pytest.raises(ValueError, match="bucket_batch_sizes"):
        resolve_dataset_conf({"batch_conf": {"batch_type": "bucket", "bucket_boundaries": [100]}})
    with pytest.raises(ValueError, match="data_type"):
        resolve_dataset_conf({"data_type": "tar"})
    conf = resolve_dataset_conf({"fbank_conf": {"num_mel_bins": 40}})
    assert conf.fbank_conf == FbankConf(num_mel_bins=40, frame_shift=10.0, frame_length=25.0, dither=1.0)
    assert conf.batch_conf.batch_size == 16


@pytest.mark.parametrize("given, message", [
    ({"spec_aug": "false"}, "dataset_conf.spec_aug: expected true or false, got 'false'"),
    ({"shuffle_conf": {"shuffle_size": 0}}, "dataset_conf.shuffle_conf.shuffle_size must be an integer >= 1"),
    ({"fbank_conf": {"dither": -1.0}}, "dataset_conf.fbank_conf.dither must be a non-negative number"),
    ({"fbank_conf": {"num_mel_bins": 80.5}}, "dataset_conf.fbank_conf.num_mel_bins: expected an integer"),
    ({"filter_conf": {"max_length": float("nan")}}, "dataset_conf.filter_conf.max_length: expected a finite number"),
    ({"batch_conf": {"batch_size": True}}, "dataset_conf.batch_conf.batch_size: expected an integer, got True"),
    ({"speed_perturb_conf": {"speeds": []}}, "speeds must be a non-empty list"),
    ({"pad_conf": {"min_length": -1}}, "dataset_conf.pad_conf.min_length must be a non-negative number of frames"),
    ({"pad_conf": {"min_length": 2001}}, "dataset_conf.pad_conf.min_length must be at most filter_conf.max_length "
                                         "(2000 frames), got 2001"),
    ({"batch_conf": "static"}, "dataset_conf.batch_conf must be a mapping"),
    ({"spec_aug_conf": {"start_epoch": -1}}, "dataset_conf.spec_aug_conf.start_epoch must be a non-negative integer"),
])
def test_every_value_is_checked_for_its_type_and_range(given, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve_dataset_conf(given)


def test_lines_per_rank_and_uneven_partition_log(tmp_path, tokenizer, caplog):
    entries = kaldi_entries(FSDD, "dev")
    data_list = write_list(tmp_path / "data.list", entries[:9])

    def lines_per_rank(conf, world_size, mode="train"):
        return build_dataset(data_list, tokenizer, conf, mode=mode, world_size=world_size).lines_per_rank()

    # Training: planned batches (2 lines; the last 1), each to the rank with fewer lines; shares per worker otherwise.
    assert lines_per_rank({"batch_conf": {"batch_size": 2}}, 2) == [5, 4]
    assert lines_per_rank({"batch_conf": {"batch_size": 2}}, 3) == [4, 3, 2]
    assert lines_per_rank({"dataloader_conf": {"num_workers": 2}}, 2, mode="cv") == [5, 4]
    assert lines_per_rank({"dataloader_conf": {"num_workers": 0}}, 2, mode="cv") == [5, 4]
    data_list = write_list(tmp_path / "data.list", entries[:5])
    with caplog.at_level(logging.INFO):
        build_dataset(data_list, tokenizer, resolve_dataset_conf({"dataloader_conf": {"num_workers": 2}}), mode="cv",
                      rank=0, world_size=2)
    assert "5 lines do not divide evenly over 2 ranks x 2 workers; lines per rank: [3, 2]" in caplog.text


def test_largest_share_counts_utterances_and_header_seconds(tmp_path, tokenizer):
    """What max_train_minutes scales its first CV estimate by: the largest rank's utterances and audio seconds."""
    entries = kaldi_entries(FSDD, "dev")[:5]
    seconds = [sf.info(e["wav"]).frames / sf.info(e["wav"]).samplerate for e in entries]
    data_list = write_list(tmp_path / "data.list", entries)
    utts, audio_s = build_dataset(data_list, tokenizer, {"dataloader_conf": {"num_workers": 0}}, mode="cv",
                                  world_size=2).largest_share()
    assert utts == 3  # lines 0, 2, 4 to rank 0
    assert audio_s == pytest.approx(max(sum(seconds[0::2]), sum(seconds[1::2])))
    shards = write_list(tmp_path / "shards.list", [{"shard": "a.tar", "num_utts": 7}, {"shard": "b.tar", "num_utts": 2},
                                                   {"shard": "c.tar", "num_utts": 1}])
    assert build_dataset(shards, tokenizer, {"data_type": "shard", "dataloader_conf": {"num_workers": 0}},
                         mode="cv", world_size=2).largest_share() == (8, None)  # a + c; audio unknown


def test_sample_spreads_over_this_ranks_share_and_batches_as_it_does(tmp_path, tokenizer):
    """What max_train_minutes times for its first CV estimate: an even sample of this rank's CV lines."""
    entries = kaldi_entries(FSDD, "train")[:40]
    data_list = write_list(tmp_path / "data.list", entries)
    conf = {"batch_conf": {"batch_size": 3}, "dataloader_conf": {"num_workers": 2, "prefetch_factor": 2}}
    rank_1 = build_dataset(data_list, tokenizer, conf, mode="cv", rank=1, world_size=2)
    sample = rank_1.sample(5)
    assert (sample.mode, sample.conf, sample.world_size) == ("cv", rank_1.conf, 1)
    # rank 1 of 2 ranks x 2 workers reads lines 2, 3, 6, 7, ... 38, 39 (20 lines): every 4th of them, in order
    assert sample.lines == [json.dumps(entries[i]) for i in (2, 10, 18, 26, 34)]
    keys, skipped = collect(build_dataloader(sample))
    assert sorted(keys) == sorted(entries[i]["key"] for i in (2, 10, 18, 26, 34)) and not skipped
    assert len(rank_1.sample(100).lines) == 20  # all of its share
    shards = write_list(tmp_path / "shards.list", [{"shard": f"{n}.tar", "num_utts": 7} for n in "abcd"])
    shard_set = build_dataset(shards, tokenizer, {"data_type": "shard", "dataloader_conf": {"num_workers": 0}},
                              mode="cv")
    assert [json.loads(line)["shard"] for line in shard_set.sample(8).lines] == ["a.tar", "b.tar"]  # whole shards


def test_raw_segments_read_only_their_span(tmp_path, tokenizer):
    entry = kaldi_entries(LJ, "dev")[0]
    entries = [dict(entry, key="seg-a", start=0.0, end=1.0), dict(entry, key="seg-b", start=1.0, end=3.5)]
    data_list = write_list(tmp_path / "data.list", entries)
    conf = {"sort": False, "filter_conf": {"max_output_input_ratio": 10.0}, "dataloader_conf": {"num_workers": 0}}
    (batch,) = batches_of(data_list, tokenizer, conf, mode="cv")
    assert batch["keys"] == ["seg-a", "seg-b"]
    assert batch["feats_lengths"].tolist() == [1 + (16000 - 400) // 160, 1 + (40000 - 400) // 160]


@pytest.mark.parametrize("section, key, value", [("batch_conf", "batch_size", 0),
                                                 ("batch_conf", "max_frames_in_batch", 0),
                                                 ("dataloader_conf", "num_workers", -1),
                                                 ("spec_aug_conf", "max_t", 0)])
def test_sizes_below_their_minimum_are_config_errors(section, key, value):
    with pytest.raises(ConfigError, match=f"dataset_conf.{section}.{key} must be an integer"):
        resolve_dataset_conf({section: {key: value}})


def test_non_finite_audio_and_features_are_skipped_named_and_counted(tmp_path, tokenizer, caplog):
    # Real speech written as float WAVs: one with 10 NaN samples, one with an infinite one, and one whose finite
    # samples are so far outside [-1, 1] that the fbank overflows. None may reach a batch; each is counted.
    good = [e for e in kaldi_entries(FSDD, "test") if "Z" not in e["txt"]][:2]
    speech, rate = sf.read(good[0]["wav"], dtype="float32")
    nan, inf = speech.copy(), speech.copy()
    nan[2000:2010] = np.nan
    inf[3000] = np.inf
    for name, samples in (("nan.wav", nan), ("inf.wav", inf), ("huge.wav", speech * np.float32(3e37))):
        sf.write(tmp_path / name, samples, rate, subtype="FLOAT")
    bad = [({"key": "bad-nan", "wav": str(tmp_path / "nan.wav"), "txt": "ONE"}, "non_finite_audio"),
           ({"key": "bad-inf", "wav": str(tmp_path / "inf.wav"), "txt": "ONE"}, "non_finite_audio"),
           ({"key": "bad-huge", "wav": str(tmp_path / "huge.wav"), "txt": "ONE"}, "non_finite_feats")]
    conf = resolve_dataset_conf({"batch_conf": {"batch_size": 2}, "dataloader_conf": {"num_workers": 0}})
    for mode in ("train", "cv"):
        data_list = write_list(tmp_path / f"{mode}.list", [b for b, _ in bad] + good)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            batches = list(build_dataloader(build_dataset(data_list, tokenizer, conf, mode=mode), conf))
        assert all(torch.isfinite(b["feats"]).all() for b in batches)
        keys, skipped = collect(batches)
        assert sorted(keys) == sorted(e["key"] for e in good)
        assert skipped == Counter({"non_finite_audio": 2, "non_finite_feats": 1})
        for entry, reason in bad:
            assert any(entry["key"] in r.getMessage() and reason in r.getMessage() for r in caplog.records)
    # The nan-audio case: the file alone as a CV list with the recipe's tiny config leaves only a B=0 batch.
    yaml_conf = resolve_dataset_conf(yaml.safe_load(open(REPO_ROOT / "examples/english/s0/conf/train_tiny.yaml"))
                                     ["dataset_conf"])
    alone = write_list(tmp_path / "nan.list", [bad[0][0]])
    (batch,) = list(build_dataloader(build_dataset(alone, tokenizer, yaml_conf, mode="cv"), yaml_conf))
    assert batch["keys"] == [] and batch["num_skipped"] == {"non_finite_audio": 1}


# The training epoch with planned batching (raw lines, static or bucket batching): planned batches that depend on
# the data alone, the same batches (keys, features, skip counts) on any number of ranks and loader workers, and a
# resumed epoch that leaves out exactly the batches its checkpoint accounted for, without reading the planned batches
# it finished.

# 80 lines in planned batches of 4 (sort runs of 12); volume perturbation, dither and SpecAugment draw from each
# planned batch's own generator.
PLANNED_CONF = {"batch_conf": {"batch_size": 4}, "sort_conf": {"sort_size": 12}, "shuffle_conf": {"shuffle_size": 8},
                "volume_perturb": True}


@pytest.fixture(scope="module")
def data_list(tmp_path_factory):
    # The tokenizer knows no Z: the 8 utterances of "ZERO" are skipped (unknown_token) wherever they land.
    return write_list(tmp_path_factory.mktemp("list") / "data.list", kaldi_entries(FSDD, "train"))


def entry_key(data_list, line_index):
    with open(data_list) as f:
        return json.loads(f.readlines()[line_index])["key"]


def epoch_batches(data_list, tokenizer, world_size, num_workers, consumed=None, epoch=1, batch_conf=None):
    """Every rank's batches of ``epoch`` (rank by rank, in loader order) and the skip counts they carry."""
    conf = {**PLANNED_CONF, "dataloader_conf": {"num_workers": num_workers, "prefetch_factor": 2}}
    conf["batch_conf"] = batch_conf or conf["batch_conf"]
    per_rank, skipped = [], Counter()
    for rank in range(world_size):
        dataset = build_dataset(data_list, tokenizer, conf, rank=rank, world_size=world_size)
        dataset.resume_epoch(epoch, consumed or {})
        per_rank.append(list(dataset.drop_replayed(build_dataloader(dataset))))
        for batch in per_rank[-1]:
            skipped.update(batch["num_skipped"])
    return per_rank, skipped


def test_batches_per_epoch_is_what_the_rank_with_the_most_reads(data_list, tokenizer):
    # what a schedule that ends with the run (warmupcosinelr) counts its steps from, before any audio is read
    for world_size in (1, 2, 3):
        per_rank, _ = epoch_batches(data_list, tokenizer, world_size, 1, epoch=0)
        dataset = build_dataset(data_list, tokenizer, PLANNED_CONF, rank=0, world_size=world_size)
        assert dataset.batches_per_epoch() == max(len(batches) for batches in per_rank) > 0
    assert build_dataset(data_list, tokenizer, PLANNED_CONF, world_size=2).batches_per_epoch() == 10  # 80 lines / 4 / 2
    dynamic = {"batch_conf": {"batch_type": "dynamic", "max_frames_in_batch": 1000}}
    assert build_dataset(data_list, tokenizer, dynamic).batches_per_epoch() is None
    assert build_dataset(data_list, tokenizer, PLANNED_CONF, mode="cv").batches_per_epoch() is None


@pytest.mark.parametrize("batch_conf", [PLANNED_CONF["batch_conf"], {"batch_type": "bucket", "bucket_boundaries": [60],
                                                                    "bucket_batch_sizes": [4, 2]}])
def test_an_epoch_has_the_same_batches_on_any_world_size_and_number_of_workers(data_list, tokenizer, batch_conf):
    (alone,), skipped = epoch_batches(data_list, tokenizer, 1, 0, batch_conf=batch_conf)
    assert skipped == {"unknown_token": 8}
    keys = [key for batch in alone for key in batch["keys"]]
    assert sorted(keys) == sorted(e["key"] for e in kaldi_entries(FSDD, "train") if "Z" not in e["txt"])
    reference = {tuple(batch["position"]): batch for batch in alone}
    for world_size, num_workers in ((2, 0), (3, 2)):
        per_rank, got_skipped = epoch_batches(data_list, tokenizer, world_size, num_workers, batch_conf=batch_conf)
        assert got_skipped == skipped and all(per_rank)
        assert max(map(len, per_rank)) - min(map(len, per_rank)) <= 1  # so the join drops at most world_size - 1
        got = {tuple(batch["position"]): batch for batch in itertools.chain(*per_rank)}
        assert got.keys() == reference.keys()
        for position, batch in got.items():
            assert batch["keys"] == reference[position]["keys"], position
            assert torch.equal(batch["feats"], reference[position]["feats"]), position
    next_epoch = epoch_batches(data_list, tokenizer, 1, 0, epoch=2, batch_conf=batch_conf)[0][0]
    assert next_epoch[0]["keys"] != alone[0]["keys"]  # reshuffled


def test_short_utterances_are_padded_alike_in_every_mode_and_on_any_world_size(data_list, tokenizer):
    # pad_conf.min_length 60: every tiny FSDD clip under 0.6 s becomes 0.6 s (58 fbank frames), in decoding as in
    # training, with the same features whichever rank reads it; longer clips keep their length. Decoding reads every
    # utterance, "ZERO"'s included (its transcript is only the reference).
    entries = kaldi_entries(FSDD, "train")
    seconds = {e["key"]: sf.info(e["wav"]).duration for e in entries}
    conf = {"pad_conf": {"min_length": 60}, "sort": False, "dataloader_conf": {"num_workers": 0}}
    feats, padding_s = {}, 0.0
    for world_size in (1, 2):
        for rank in range(world_size):
            for batch in batches_of(data_list, tokenizer, conf, mode="test", rank=rank, world_size=world_size):
                padding_s += batch["padding_s"] / 2  # each utterance decoded once per world size
                for key, feat, length in zip(batch["keys"], batch["feats"], batch["feats_lengths"].tolist()):
                    expected = 58 if seconds[key] < 0.6 else 1 + (round(seconds[key] * 16000) - 400) // 160
                    assert length == expected, key
                    assert key not in feats or torch.equal(feats[key], feat[:length]), key
                    feats[key] = feat[:length]
    assert sorted(feats) == sorted(seconds) and sum(s < 0.6 for s in seconds.values()) > len(seconds) // 2
    assert padding_s == pytest.approx(sum(0.6 - s for s in seconds.values() if s < 0.6), abs=1e-6)
    # Training plans its batches from the padded lengths.
    trained = build_dataset(data_list, tokenizer, conf)
    assert min(trained.frames) == 60 and max(trained.frames) == int(max(seconds.values()) * 100)


def test_a_resumed_epoch_leaves_out_what_was_consumed_and_reads_no_finished_planned_batch(data_list, tokenizer,
                                                                                           monkeypatch):
    (first, second), _ = epoch_batches(data_list, tokenizer, 2, 2)
    # The checkpoint: each of the 2 ranks (2 loader workers each) trained its first 3 batches (each part of the epoch
    # is one planned batch, so these are 6 finished parts).
    consumed = {}
    for batch in first[:3] + second[:3]:
        part, index, last = batch["position"]
        consumed[part] = (index + 1, last)
    finished = [part for part, (_, done) in consumed.items() if done]
    assert len(finished) == len(consumed) == 6
    # On 2 ranks again: each rank goes on with exactly the batches it would have trained next, in the order its
    # loader's round robin over the workers gave them.
    (first_rest, second_rest), _ = epoch_batches(data_list, tokenizer, 2, 2, consumed)
    for rest, full in ((first_rest, first), (second_rest, second)):
        assert [b["position"] for b in rest] == [b["position"] for b in full[3:]]
        assert all(torch.equal(a["feats"], b["feats"]) for a, b in zip(rest, full[3:]))
    # On 3 ranks: every utterance the checkpoint did not account for, once; the finished planned batches are not read.
    parts = build_dataset(data_list, tokenizer, PLANNED_CONF).parts(1, 1)
    unread = {entry_key(data_list, i) for part in finished for i in parts[part][0]}
    reads = []
    read_audio = processor.read_audio
    monkeypatch.setattr(processor, "read_audio", lambda sample: reads.append(sample["key"]) or read_audio(sample))
    per_rank, _ = epoch_batches(data_list, tokenizer, 3, 0, consumed)
    before = [key for batch in first[:3] + second[:3] for key in batch["keys"]]
    after = [key for batch in itertools.chain(*per_rank) for key in batch["keys"]]
    assert sorted(before + after) == sorted(key for batch in first + second for key in batch["keys"])
    assert len(reads) == 80 - len(unread) and not unread & set(reads)


def test_decoding_features_equal_the_test_pipelines(tmp_path, tokenizer):
    # toolkit-transcribe's features of a recording equal recognize.py's of the same audio in a data.list: resampled
    # (a tiny_lj clip's samples written at 22.05 kHz) and padded (the short fsdd digits, under pad_conf's 50 frames)
    from toolkit.dataset.pipeline import decoding_features
    lj = kaldi_entries(LJ, "test")[0]
    sf.write(tmp_path / "lj.wav", sf.read(lj["wav"], dtype="float32")[0], 22050)
    entries = kaldi_entries(FSDD, "test")[:3] + [dict(lj, wav=str(tmp_path / "lj.wav"))]
    conf = resolve_dataset_conf({"pad_conf": {"min_length": 50},
                                 "batch_conf": {"batch_type": "static", "batch_size": 1}, "sort": False})
    batches = batches_of(write_list(tmp_path / "data.list", entries), tokenizer, conf, mode="test")
    padded = 0
    for entry, batch in zip(entries, batches):
        sample = decoding_features(processor.read_audio({"key": entry["key"], "wav": entry["wav"]}), conf)
        assert batch["keys"] == [entry["key"]]
        assert torch.equal(sample["feat"], batch["feats"][0])
        assert sample["padding_s"] == pytest.approx(batch["padding_s"])
        padded += sample["padding_s"] > 0
    assert len(batches) == len(entries) and padded >= 1
