"""``dataset_conf``: the typed settings of the data pipeline, one dataclass per step, in pipeline order.

Built from the YAML's ``dataset_conf`` by :func:`resolve_dataset_conf` (through
:func:`toolkit.utils.config_parsing.typed`): keys it leaves out take the defaults below, an unknown key or a wrongly
typed value stops with a one-line :class:`~toolkit.utils.config_parsing.ConfigError`. Lengths are in 10 ms frames
unless the name says otherwise; the frame shift itself is ``fbank_conf.frame_shift`` (ms).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal, Optional

from toolkit.utils.config_parsing import fill_defaults, require, typed


@dataclass
class FilterConf:
    """Drop utterances out of range (``processor.filter_sample``); lengths in frames of ``fbank_conf.frame_shift``."""

    SECTION: ClassVar[str] = "dataset_conf.filter_conf"
    max_length: float = 2000.0
    min_length: float = 10.0
    token_max_length: int = 200
    token_min_length: int = 1
    min_output_input_ratio: float = 0.0005  # tokens per frame
    max_output_input_ratio: float = 1.0

    def __post_init__(self):
        require(0 <= self.min_length <= self.max_length, self.SECTION, "0 <= min_length <= max_length",
                (self.min_length, self.max_length))
        require(0 <= self.token_min_length <= self.token_max_length, self.SECTION,
                "0 <= token_min_length <= token_max_length", (self.token_min_length, self.token_max_length))
        require(0 <= self.min_output_input_ratio <= self.max_output_input_ratio, self.SECTION,
                "0 <= min_output_input_ratio <= max_output_input_ratio",
                (self.min_output_input_ratio, self.max_output_input_ratio))


@dataclass
class PadConf:
    """Pad utterances shorter than ``min_length`` frames of ``fbank_conf.frame_shift`` with near-silence
    (``processor.pad_short``), in every mode; 0 turns the step off."""

    SECTION: ClassVar[str] = "dataset_conf.pad_conf"
    min_length: float = 0.0

    def __post_init__(self):
        require(self.min_length >= 0, f"{self.SECTION}.min_length", "a non-negative number of frames", self.min_length)


@dataclass
class ResampleConf:
    SECTION: ClassVar[str] = "dataset_conf.resample_conf"
    resample_rate: int = 16000  # Hz

    def __post_init__(self):
        require(self.resample_rate >= 1000, f"{self.SECTION}.resample_rate", "at least 1000 Hz", self.resample_rate)


@dataclass
class SpeedPerturbConf:
    """Speed perturbation factors, drawn uniformly per utterance (Ko et al., Interspeech 2015)."""

    SECTION: ClassVar[str] = "dataset_conf.speed_perturb_conf"
    speeds: list[float] = field(default_factory=lambda: [0.9, 1.0, 1.1])

    def __post_init__(self):
        require(len(self.speeds) > 0 and all(0.5 <= s <= 2.0 for s in self.speeds), f"{self.SECTION}.speeds",
                "a non-empty list of factors in [0.5, 2]", self.speeds)


@dataclass
class VolumePerturbConf:
    SECTION: ClassVar[str] = "dataset_conf.volume_perturb_conf"
    min_gain_db: float = -30.0
    max_gain_db: float = 6.0

    def __post_init__(self):
        require(self.min_gain_db <= self.max_gain_db, self.SECTION, "min_gain_db <= max_gain_db",
                (self.min_gain_db, self.max_gain_db))


@dataclass
class TokenizeConf:
    SECTION: ClassVar[str] = "dataset_conf.tokenize_conf"
    max_unk_ratio: float = 0.0  # largest fraction of <unk> units an utterance may have (0: none)

    def __post_init__(self):
        require(0.0 <= self.max_unk_ratio <= 1.0, f"{self.SECTION}.max_unk_ratio", "in [0, 1]", self.max_unk_ratio)


@dataclass
class FbankConf:
    """Kaldi log mel filterbank (``processor.compute_fbank``)."""

    SECTION: ClassVar[str] = "dataset_conf.fbank_conf"
    num_mel_bins: int = 80  # D, the model's input size
    frame_shift: float = 10.0  # ms
    frame_length: float = 25.0  # ms
    dither: float = 1.0  # standard deviation of the noise added to the 16-bit samples (training only)

    def __post_init__(self):
        require(self.num_mel_bins >= 1, f"{self.SECTION}.num_mel_bins", "a positive integer", self.num_mel_bins)
        require(0 < self.frame_shift <= self.frame_length, self.SECTION, "0 < frame_shift <= frame_length (ms)",
                (self.frame_shift, self.frame_length))
        require(self.dither >= 0.0, f"{self.SECTION}.dither", "a non-negative number", self.dither)

    @property
    def frame_shift_s(self) -> float:
        return self.frame_shift / 1000.0


@dataclass
class SpecAugConf:
    """SpecAugment masks (Park et al., Interspeech 2019), without time warping, in training epochs ``start_epoch``
    on (counted from 0, as ``epoch_N.pt``): a short run can learn the clean features first and be regularised in
    its later epochs only."""

    SECTION: ClassVar[str] = "dataset_conf.spec_aug_conf"
    num_t_mask: int = 2
    num_f_mask: int = 2
    max_t: int = 50  # frames
    max_f: int = 10  # mel bins
    start_epoch: int = 0

    def __post_init__(self):
        for name in ("num_t_mask", "num_f_mask", "start_epoch"):
            require(getattr(self, name) >= 0, f"{self.SECTION}.{name}", "a non-negative integer", getattr(self, name))
        for name in ("max_t", "max_f"):
            require(getattr(self, name) >= 1, f"{self.SECTION}.{name}", "an integer >= 1", getattr(self, name))


@dataclass
class ShuffleConf:
    SECTION: ClassVar[str] = "dataset_conf.shuffle_conf"
    shuffle_size: int = 1500  # utterances per shuffle buffer

    def __post_init__(self):
        require(self.shuffle_size >= 1, f"{self.SECTION}.shuffle_size", "an integer >= 1", self.shuffle_size)


@dataclass
class SortConf:
    SECTION: ClassVar[str] = "dataset_conf.sort_conf"
    sort_size: int = 500  # utterances per sort buffer

    def __post_init__(self):
        require(self.sort_size >= 1, f"{self.SECTION}.sort_size", "an integer >= 1", self.sort_size)


@dataclass
class BatchConf:
    """``static``: ``batch_size`` utterances; ``dynamic``: padded frames ``B * max(T)`` up to
    ``max_frames_in_batch``; ``bucket``: ``bucket_batch_sizes[i]`` utterances of lengths in bucket ``i`` of
    ``bucket_boundaries`` (frames, ascending)."""

    SECTION: ClassVar[str] = "dataset_conf.batch_conf"
    batch_type: Literal["static", "dynamic", "bucket"] = "static"
    batch_size: int = 16
    max_frames_in_batch: int = 12000
    bucket_boundaries: list[int] = field(default_factory=lambda: [500, 1000])
    bucket_batch_sizes: list[int] = field(default_factory=lambda: [32, 16, 8])

    def __post_init__(self):
        for name in ("batch_size", "max_frames_in_batch"):
            require(getattr(self, name) >= 1, f"{self.SECTION}.{name}", "an integer >= 1", getattr(self, name))
        if self.batch_type == "bucket":
            boundaries, sizes = self.bucket_boundaries, self.bucket_batch_sizes
            require(len(sizes) == len(boundaries) + 1, f"{self.SECTION}.bucket_batch_sizes",
                    f"len(bucket_boundaries) + 1 = {len(boundaries) + 1} entries", sizes)
            require(all(a < b for a, b in zip(boundaries, boundaries[1:])), f"{self.SECTION}.bucket_boundaries",
                    "strictly ascending", boundaries)
            require(min(sizes) >= 1, f"{self.SECTION}.bucket_batch_sizes", "integers >= 1", sizes)


@dataclass
class DataLoaderConf:
    SECTION: ClassVar[str] = "dataset_conf.dataloader_conf"
    num_workers: int = 1
    prefetch_factor: int = 4  # batches each worker keeps ready (num_workers > 0 only)
    pin_memory: bool = False
    persistent_workers: bool = False

    def __post_init__(self):
        require(self.num_workers >= 0, f"{self.SECTION}.num_workers", "an integer >= 0", self.num_workers)
        require(self.prefetch_factor >= 1, f"{self.SECTION}.prefetch_factor", "an integer >= 1",
                self.prefetch_factor)


@dataclass
class DatasetConf:
    """The pipeline, top to bottom. ``data_type``: what a data.list line is (``raw`` utterance JSON or ``shard``
    path). Augmentations (speed/volume perturbation, dither, SpecAugment) and shuffling apply in training only."""

    data_type: Literal["raw", "shard"] = "raw"
    filter_conf: FilterConf = field(default_factory=FilterConf)
    pad_conf: PadConf = field(default_factory=PadConf)
    resample_conf: ResampleConf = field(default_factory=ResampleConf)
    speed_perturb: bool = False
    speed_perturb_conf: SpeedPerturbConf = field(default_factory=SpeedPerturbConf)
    volume_perturb: bool = False
    volume_perturb_conf: VolumePerturbConf = field(default_factory=VolumePerturbConf)
    tokenize_conf: TokenizeConf = field(default_factory=TokenizeConf)
    fbank_conf: FbankConf = field(default_factory=FbankConf)
    spec_aug: bool = True
    spec_aug_conf: SpecAugConf = field(default_factory=SpecAugConf)
    shuffle: bool = True
    shuffle_conf: ShuffleConf = field(default_factory=ShuffleConf)
    sort: bool = True
    sort_conf: SortConf = field(default_factory=SortConf)
    batch_conf: BatchConf = field(default_factory=BatchConf)
    dataloader_conf: DataLoaderConf = field(default_factory=DataLoaderConf)

    def __post_init__(self):
        require(self.pad_conf.min_length <= self.filter_conf.max_length, f"{PadConf.SECTION}.min_length",
                f"at most filter_conf.max_length ({self.filter_conf.max_length:g} frames)", self.pad_conf.min_length)


def resolve_dataset_conf(given: DatasetConf | dict | None) -> DatasetConf:
    """The typed ``dataset_conf`` from the YAML's dict (None or partial: defaults fill the rest); a
    :class:`DatasetConf` is returned as it is.

    Raises:
        ConfigError: an unknown key at any level (the message lists the valid ones), a value of the wrong type (a
            string for a boolean, a boolean for a number), a choice not offered (``data_type``, ``batch_type``), or a
            value out of range (each dataclass's ``__post_init__``).
    """
    return typed(DatasetConf, given, "dataset_conf")


def fill_dataset_defaults(given: Optional[dict]) -> dict:
    """``given`` with every key the YAML leaves out set to its default (unchecked), so that an override can set it."""
    return fill_defaults(DatasetConf, given)
