#!/usr/bin/env bash
# Kaldi data dirs for the English recipe from corpora in the shipped layout
# (<corpus_dir>/<corpus>/data/{train,dev,test}/{wav.scp,text}, wav.scp paths relative to <corpus_dir>/<corpus>).
#
#   local/prepare_data.sh <corpus_dir> <data_dir> <corpus>...
#
# Writes <data_dir>/train (union of the corpora's train splits), <data_dir>/dev (union of dev splits, the CV set), and
# <data_dir>/dev_<corpus> and <data_dir>/test_<corpus> for each corpus, each with wav.scp (absolute paths), text and
# utt2dur (if present).
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,7p' "$0"; exit 1; }
corpus_dir=$(cd "$1" && pwd); data=$2; shift 2

union() {  # union <out_dir> <split> <corpus>...
  local out=$1 split=$2; shift 2
  mkdir -p "$out"; : > "$out/wav.scp.tmp"; : > "$out/text.tmp"; : > "$out/utt2dur.tmp"
  for corpus in "$@"; do
    local src=$corpus_dir/$corpus/data/$split
    for f in wav.scp text; do
      [ -f "$src/$f" ] || { echo "$0: missing $src/$f (is --corpus_dir right?)" >&2; exit 1; }
    done
    awk -v root="$corpus_dir/$corpus" '{p=$2; if (p !~ /^\//) p=root "/" p; print $1, p}' "$src/wav.scp" \
      >> "$out/wav.scp.tmp"
    cat "$src/text" >> "$out/text.tmp"
    [ -f "$src/utt2dur" ] && cat "$src/utt2dur" >> "$out/utt2dur.tmp"
  done
  for f in wav.scp text utt2dur; do LC_ALL=C sort -k1,1 "$out/$f.tmp" > "$out/$f"; rm "$out/$f.tmp"; done
  [ -s "$out/utt2dur" ] || rm "$out/utt2dur"
  dups=$(cut -d' ' -f1 "$out/wav.scp" | uniq -d | head -3)
  [ -z "$dups" ] || { echo "$0: duplicate keys across corpora in $out: $dups" >&2; exit 1; }
  echo "$0: $out: $(wc -l < "$out/wav.scp") utterances"
}

union "$data/train" train "$@"
union "$data/dev" dev "$@"
for corpus in "$@"; do
  union "$data/dev_$corpus" dev "$corpus"
  union "$data/test_$corpus" test "$corpus"
done
