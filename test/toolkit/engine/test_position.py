"""Where training stands: the epoch position a rank counts from its batches' ``position`` (saved, resharded, and
loaded from checkpoints that called it "chunks"), the data setup a mid-epoch resume needs unchanged, and the
dataset's side of resuming, declared by ResumableDataset and implemented by AsrDataset."""

import inspect
import json

import pytest

from toolkit.dataset.pipeline import AsrDataset
from toolkit.engine.position import EpochPosition, ResumableDataset, TrainProgress, data_signature
from toolkit.utils.config_parsing import ConfigError


def test_the_position_counts_each_parts_batches_read():
    position = EpochPosition()
    for part, index, last in ((3, 0, False), (5, 0, True), (3, 1, False), (3, 2, True)):
        position.add({"keys": ["k"], "position": [part, index, last]})
    position.add({"keys": ["k"]})  # no position (a loader other than the dataset's): not tracked
    assert position.batches_read == {3: (3, True), 5: (1, True)}
    restored = EpochPosition()
    restored.load_state_dict(position.state_dict())
    assert restored.batches_read == {3: (3, True), 5: (1, True)}


def test_another_world_size_gets_the_furthest_every_saved_rank_read():
    states = [{"batches_read": {0: (2, True), 2: (1, False)}}, {"batches_read": {0: (1, False), 1: (4, False)}}]
    assert EpochPosition.reshard(states, 0) == {"batches_read": {0: (2, True), 1: (4, False), 2: (1, False)}}
    assert EpochPosition.reshard(states, 1) == EpochPosition.reshard(states, 0)


def test_a_checkpoint_of_the_unsplit_executor_still_loads():
    position = EpochPosition()
    position.load_state_dict({"chunks": {4: (2, False)}})
    assert position.batches_read == {4: (2, False)}
    assert EpochPosition.reshard([{"chunks": {4: (2, False)}}, {"batches_read": {4: (3, True)}}], 0) == {
        "batches_read": {4: (3, True)}}


def test_the_signature_is_sorted_json_of_the_setup():
    signature = data_signature(None, "train.list", {"batch_conf": {"batch_size": 4}}, 2)
    assert json.loads(signature) == {"accum_grad": 2, "dataset_conf": {"batch_conf": {"batch_size": 4}},
                                     "train_data": "train.list", "world_size": None}
    assert signature.index('"accum_grad"') < signature.index('"world_size"')


def test_a_mid_epoch_position_continues_only_under_its_own_setup():
    two_ranks, four_ranks = (data_signature(n, "train.list", {}, 1) for n in (2, 4))
    progress = TrainProgress(epoch=3, batches_in_epoch=5, data_signature=two_ranks)
    progress.continue_under(two_ranks, "step_9.pt")
    assert progress.data_signature == two_ranks
    with pytest.raises(ConfigError, match=r"--checkpoint step_9.pt stops inside epoch 3, but world_size changed "
                                          r"since it was written \(by 2 ranks: .*resume from the last epoch_N.pt"):
        progress.continue_under(four_ranks, "step_9.pt")
    progress.data_signature = ""
    with pytest.raises(ConfigError, match="written by an earlier version"):
        progress.continue_under(two_ranks, "step_9.pt")
    at_an_epoch_boundary = TrainProgress(epoch=3, data_signature=two_ranks)
    at_an_epoch_boundary.continue_under(four_ranks, "epoch_2.pt")
    assert at_an_epoch_boundary.data_signature == four_ranks  # what this run's step checkpoints stand for


def test_the_pipeline_dataset_implements_the_resume_protocol():
    assert issubclass(AsrDataset, ResumableDataset)
    for name in ("set_seed", "set_epoch", "resume_epoch", "drop_replayed"):
        declared = list(inspect.signature(getattr(ResumableDataset, name)).parameters)
        implemented = list(inspect.signature(getattr(AsrDataset, name)).parameters)
        assert implemented[-len(declared) + 1:] == declared[1:], name  # the same arguments after self
    placeholders = [{"keys": ["a"]}, {"replayed": True}, {"keys": ["b"]}]
    assert list(AsrDataset.drop_replayed(placeholders)) == [{"keys": ["a"]}, {"keys": ["b"]}]
