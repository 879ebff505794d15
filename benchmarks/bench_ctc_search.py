#!/usr/bin/env python3
"""Time per frame of CTC prefix beam search against the utterance's length, between source revisions: whether it
stays flat (linear total time) or grows (the quadratic search before issue 46), with and without the word LM.

Posteriors: one blank-heavy (T, V) matrix per length, made once and fed to every revision: the char units of
corpora/tiny_lj's transcripts, cycled, each unit a frame whose log-softmax logits give it +6 over Gaussian noise
(seeded) followed by 1-3 frames peaked on blank the same way, so a hypothesis holds about T / 3 tokens of real
words with close competitors. The LM: a 3-gram Kneser-Ney ARPA of the same transcripts' words
(``toolkit.text.kneser_ney``) as ``WordNgramLM`` with weight 0.5, word bonus 0.5 and OOV penalty -1.

Each revision (``--revs``: git revisions of this repository, each checked out once as a detached worktree under
``--out_dir``, or ``worktree`` for the files as they are now) runs this script in a child process with its folder
first on ``PYTHONPATH``, which times ``ctc_prefix_beam_search(log_probs, beam)`` over the whole matrix (and, where
the revision has ``CtcPrefixBeamSearch``, the same frames fed in chunks of ``--chunk`` frames, a call returning the
partial n-best after each), ``--repeats`` times, the revisions alternating. Each child makes one untimed call first,
and each timed call starts after a full garbage collection (so that one falling inside a short call does not decide
its time). Times are CPU seconds of the process on one thread: on a shared machine wall time would also count the
time other processes hold the core. Prints per length and LM the best-of-repeats milliseconds per frame of each
revision, its growth over the shortest length (1.0 when time is linear in T), the ratio to the first revision, and
whether every revision gave the same n-best (tokens and scores, bit for bit).

    python benchmarks/bench_ctc_search.py --revs 5fad287 worktree --out_dir /tmp/bench_ctc_search
"""
import argparse
import gc
import hashlib
import json
import os
import subprocess
import sys
import time

import torch

from harness import WORKTREE, source_env, source_tree

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(REPO, "corpora", "tiny_lj", "data")


def transcripts() -> list[list[str]]:
    sentences = []
    for split in ("train", "dev", "test"):
        with open(os.path.join(CORPUS, split, "text"), encoding="utf-8") as f:
            sentences += [line.split()[1:] for line in f if line.strip()]
    return sentences


def make_inputs(lengths: list[int], out_dir: str) -> None:
    """Writes ``units.json`` (id -> unit), ``lm.arpa`` and ``posteriors.pt`` ({T: float32 (T, V)}) to ``out_dir``."""
    from toolkit.text.kneser_ney import kneser_ney_arpa
    from toolkit.text.tokenizer import WORD_BOUNDARY
    sentences = transcripts()
    letters = sorted({c for s in sentences for w in s for c in w})
    units = ["<blank>", "<unk>", *letters, WORD_BOUNDARY]
    ids = {u: i for i, u in enumerate(units)}
    stream = [ids[WORD_BOUNDARY if c == " " else c] for s in sentences for c in " ".join(s) + " "]
    generator = torch.Generator().manual_seed(0)
    posteriors = {}
    for length in lengths:
        targets, position = [], 0
        while len(targets) < length:
            targets.append(stream[position % len(stream)])
            position += 1
            targets += [0] * int(torch.randint(1, 4, (1,), generator=generator))
        logits = torch.randn(length, len(units), generator=generator)
        logits[torch.arange(length), torch.tensor(targets[:length])] += 6.0
        posteriors[length] = logits.log_softmax(dim=1)
    with open(os.path.join(out_dir, "units.json"), "w", encoding="utf-8") as f:
        json.dump(units, f)
    with open(os.path.join(out_dir, "lm.arpa"), "w", encoding="utf-8") as f:
        f.write(kneser_ney_arpa(sentences, order=3))
    torch.save(posteriors, os.path.join(out_dir, "posteriors.pt"))


def child(args) -> None:
    """Times this revision's search on the inputs in ``args.out_dir``; prints one JSON line."""
    from toolkit.models.transformer import search
    from toolkit.text.ngram_lm import WordNgramLM
    with open(os.path.join(args.out_dir, "units.json"), encoding="utf-8") as f:
        units = dict(enumerate(json.load(f)))
    lm = WordNgramLM(os.path.join(args.out_dir, "lm.arpa"), units, 0.5, 0.5, oov_penalty=-1.0)
    posteriors = torch.load(os.path.join(args.out_dir, "posteriors.pt"))
    search.ctc_prefix_beam_search(posteriors[min(posteriors)], args.beam, lm)  # untimed: first-call costs
    result = {}
    for with_lm in (False, True):
        for length, log_probs in posteriors.items():
            gc.collect()
            start = time.process_time()
            nbest = search.ctc_prefix_beam_search(log_probs, args.beam, lm if with_lm else None)
            row = {"whole_s": time.process_time() - start,
                   "nbest": hashlib.sha1(repr(nbest).encode()).hexdigest()[:12]}
            if hasattr(search, "CtcPrefixBeamSearch"):
                gc.collect()
                start = time.process_time()
                streaming = search.CtcPrefixBeamSearch(args.beam, lm if with_lm else None)
                for chunk in log_probs.split(args.chunk):
                    streaming.feed(chunk)
                chunked = streaming.finish()
                row["chunked_s"] = time.process_time() - start
                row["chunked_same"] = chunked == nbest
            result[f"{with_lm:d}_{length}"] = row
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--revs", nargs="+", default=[WORKTREE],
                        help=f"git revisions of this repository to compare, or '{WORKTREE}' (the files as they are)")
    parser.add_argument("--out_dir", required=True, help="inputs and the revisions' checkouts go here")
    parser.add_argument("--lengths", nargs="+", type=int, default=[250, 500, 1000, 2000, 4000], help="frames T")
    parser.add_argument("--beam", type=int, default=10)
    parser.add_argument("--chunk", type=int, default=16, help="frames per call of the chunked run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.child:
        child(args)
        return
    # 1. Inputs, made once by this checkout.
    os.makedirs(args.out_dir, exist_ok=True)
    make_inputs(args.lengths, args.out_dir)
    # 2. Each revision times them in its own process, the revisions alternating.
    sources = {rev: source_tree(REPO, rev, args.out_dir) for rev in args.revs}
    runs = {rev: [] for rev in args.revs}
    for _ in range(args.repeats):
        for rev in args.revs:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--out_dir", args.out_dir,
                   "--lengths", *map(str, args.lengths), "--beam", str(args.beam), "--chunk", str(args.chunk)]
            env = source_env(sources[rev], {"OMP_NUM_THREADS": "1"})
            env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(__file__)), env["PYTHONPATH"]])
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                sys.exit(f"bench_ctc_search.py: revision {rev} failed:\n{proc.stderr[-3000:]}")
            runs[rev].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    # 3. The table: best of the repeats.
    first = args.revs[0]
    print(f"beam {args.beam}, best of {args.repeats}; growth: ms/frame over that of T={args.lengths[0]}; "
          f"ratio: ms/frame of {first} / this revision's; chunked: fed {args.chunk} frames a call")
    print(f"{'LM':>3} {'T':>5} {'revision':>10} {'ms/frame':>9} {'growth':>7} {'ratio':>7} {'chunked':>8} "
          f"{'same n-best':>12}")
    for with_lm in (0, 1):
        shortest = {}
        for length in args.lengths:
            key = f"{with_lm}_{length}"
            base = min(r[key]["whole_s"] for r in runs[first]) / length
            for rev in args.revs:
                rows = [r[key] for r in runs[rev]]
                per_frame = min(row["whole_s"] for row in rows) / length
                shortest.setdefault(rev, per_frame)
                chunked = (f"{1000 * min(row['chunked_s'] for row in rows) / length:8.3f}"
                           + ("" if all(row["chunked_same"] for row in rows) else " DIFFERS")
                           if "chunked_s" in rows[0] else f"{'-':>8}")
                same = all(row["nbest"] == runs[first][0][key]["nbest"] for row in rows)
                print(f"{'yes' if with_lm else 'no':>3} {length:>5} {rev:>10} {1000 * per_frame:>9.3f} "
                      f"{per_frame / shortest[rev]:>7.2f} {base / per_frame:>7.2f} {chunked} "
                      f"{'yes' if same else 'NO':>12}")


if __name__ == "__main__":
    main()
