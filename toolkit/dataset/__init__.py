"""The data pipeline: data.list -> audio -> fbank -> padded batches (see :mod:`toolkit.dataset.pipeline`), and the
DataLoader around it (:mod:`toolkit.dataset.loader`)."""

from __future__ import annotations

from toolkit.dataset.conf import DatasetConf, fill_dataset_defaults, resolve_dataset_conf
from toolkit.dataset.data_list import count_utterances
from toolkit.dataset.loader import build_dataloader
from toolkit.dataset.pipeline import build_dataset

__all__ = ["DatasetConf", "build_dataloader", "build_dataset", "count_utterances", "fill_dataset_defaults",
           "init_dataset_and_dataloader", "resolve_dataset_conf"]


def init_dataset_and_dataloader(train_data: str, cv_data: str, tokenizer, conf: DatasetConf, rank: int,
                                world_size: int, seed: int):
    """Training and CV datasets of this rank with their loaders: ``(train_set, train_loader, cv_set, cv_loader)``.

    The training set shuffles per epoch (``train_set.set_epoch``) with a seed shared by all ranks; CV keeps its
    order and runs without SpecAugment or dither. Both are partitioned so that every utterance is read by exactly
    one rank and one loader worker.
    """
    train_set = build_dataset(train_data, tokenizer, conf, mode="train", rank=rank, world_size=world_size, seed=seed)
    cv_set = build_dataset(cv_data, tokenizer, conf, mode="cv", rank=rank, world_size=world_size, seed=seed)
    return train_set, build_dataloader(train_set), cv_set, build_dataloader(cv_set)
