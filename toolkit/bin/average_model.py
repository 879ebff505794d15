"""Average the parameters of several epoch checkpoints (the usual last step before decoding).

Usage:

    python -m toolkit.bin.average_model --src_path exp/conformer --num 3 --val_best \\
        --dst_model exp/conformer/avg_3.pt

``--val_best`` picks the ``num`` checkpoints with the lowest ``cv_loss`` in their ``epoch_N.yaml``; otherwise the
last ``num`` epochs. Only committed checkpoints (with their YAML) are considered. Integer buffers (e.g. BatchNorm's
``num_batches_tracked``) are taken from the newest selected checkpoint instead of being averaged.
"""

from __future__ import annotations

import argparse
import logging
import sys

import torch

from toolkit.utils.checkpoint import MODEL_KEY, list_checkpoints, load_checkpoint, load_info, save_checkpoint


def select_checkpoints(src_path: str, num: int, val_best: bool) -> list[str]:
    """Paths of the checkpoints to average, oldest first.

    Raises:
        FileNotFoundError: fewer than one committed ``epoch_N.pt`` in ``src_path``.
    """
    paths = list_checkpoints(src_path)
    if not paths:
        raise FileNotFoundError(f"no committed epoch_N.pt (with epoch_N.yaml) in {src_path}")
    if val_best:
        scored = [(load_info(p).get("cv_loss", float("inf")), p) for p in paths]
        chosen = {p for _, p in sorted(scored)[:num]}
        return [p for p in paths if p in chosen]
    return paths[-num:]


def average_checkpoints(paths: list[str]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the float tensors of ``paths``' model state dicts (accumulated in float64)."""
    total: dict[str, torch.Tensor] = {}
    newest: dict[str, torch.Tensor] = {}
    for path in paths:
        newest = load_checkpoint(path)[MODEL_KEY]
        for key, value in newest.items():
            if value.is_floating_point():
                total[key] = total.get(key, 0) + value.to(torch.float64)
    return {key: (total[key] / len(paths)).to(value.dtype) if key in total else value
            for key, value in newest.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src_path", required=True, help="model dir holding epoch_N.pt + epoch_N.yaml")
    parser.add_argument("--dst_model", required=True, help="output .pt (a .yaml listing the sources is written too)")
    parser.add_argument("--num", type=int, default=5, help="how many checkpoints to average")
    parser.add_argument("--val_best", action="store_true", help="pick by lowest cv_loss instead of the last ones")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        paths = select_checkpoints(args.src_path, args.num, args.val_best)
    except FileNotFoundError as e:
        logging.error("%s", e)
        sys.exit(1)
    for path in paths:
        logging.info("averaging %s (cv_loss %s)", path, load_info(path).get("cv_loss"))
    save_checkpoint(args.dst_model, {MODEL_KEY: average_checkpoints(paths)},
                    {"averaged": paths, "val_best": args.val_best, "tag": "average"})
    logging.info("wrote %s from %d checkpoints", args.dst_model, len(paths))


if __name__ == "__main__":
    main()
