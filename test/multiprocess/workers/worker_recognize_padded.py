"""``toolkit.bin.recognize`` with a padded partition, the mistake the decoding tests must catch: like a
``DistributedSampler`` that evens out the ranks, the data.list is padded by repeating its last line until every
rank and loader worker gets the same number of lines, so that utterance is decoded twice.

    torchrun --nproc_per_node=N worker_recognize_padded.py <recognize arguments>
"""

import sys

from toolkit.bin import recognize

build_dataset = recognize.build_dataset


def padded_build_dataset(*args, **kwargs):
    dataset = build_dataset(*args, **kwargs)
    workers = dataset.world_size * max(1, dataset.conf.dataloader_conf.num_workers)
    dataset.lines += dataset.lines[-1:] * (-len(dataset.lines) % workers)
    return dataset


if __name__ == "__main__":  # loader workers run this file's top level again
    recognize.build_dataset = padded_build_dataset
    recognize.main(sys.argv[1:])
