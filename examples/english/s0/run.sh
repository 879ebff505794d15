#!/usr/bin/env bash
# English ASR recipe on the shipped real speech (speechocean762, kathleen, ljspeech, fsdd): a conformer CTC/attention
# model trained with torchrun, decoded on one test set per corpus, scored with WER and CER.
#
#   bash run.sh                                # everything, stages -1..5
#   bash run.sh --stage 4 --stop_stage 4       # only training
#   bash run.sh --corpus_dir /data/my_corpora --corpora "fsdd" --dir exp/fsdd
#   bash run.sh --train_config conf/train_conformer_gpu.yaml   # GPUs: one process per GPU (--nproc_per_node)
#   bash run.sh --stage 5 --decode_nproc_per_node 4                        # decode with 4 ranks per node
#   bash run.sh --num_nodes 2 --HOST_NODE_ADDR node0:29400   # run the same command on every node
#   bash run.sh --stage 4 --stop_stage 4 --max_restarts 3     # a dead rank restarts the job from its last checkpoint
#   bash run.sh --stage 4 --checkpoint auto                    # continue the run in --dir from its newest checkpoint
#   bash run.sh --stage 4 --start_over true                    # train anew in --dir: its run moves to previous_runs/N/
#
#   bash run.sh --data_type shard              # tar shards (stage 3) instead of one file per utterance
#
# Stages: -1 corpus check, 0 data dirs, 1 global CMVN, 2 dictionary (char or BPE) and word n-gram LM,
#         3 data.list (raw or shards), 4 training, 5 averaging + decoding on every rank (the LM fused into the CTC
#         prefix beam search and attention rescoring) + scoring (RESULTS.md in the model dir).
# Every variable below can be set as --name value; relative paths are relative to this directory.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
. ./path.sh

stage=-1
stop_stage=5
corpus_dir=../../../corpora          # <corpus>/data/{train,dev,test}/{wav.scp,text}
corpora="speechocean762 kathleen ljspeech fsdd"
data=data
dir=exp/conformer
tensorboard_dir=tensorboard            # curves of --dir exp/conformer: tensorboard/exp/conformer (a folder per model dir)
train_config=conf/train_conformer.yaml
overrides=                           # extra training overrides, ';'-separated: "train_conf.max_epoch 3;optim_conf.lr 0.001"
token_type=char                      # char | bpe
nbpe=300
bpe_mode=unigram                     # unigram | bpe
data_type=raw                        # raw | shard: data.list of utterances, or of tar shards (data/<set>/shards/)
num_utts_per_shard=200
audio_format=flac                    # keep | flac | wav: stage 3 stores the audio as 16-bit FLAC (raw: data/<set>/audio/,
                                     # shards: inside the tars), which decodes about twice as fast as Ogg Opus
list_workers=2                       # stage 3: processes re-encoding audio or writing shards
nproc_per_node=                      # default: number of GPUs, else 2 CPU processes (gloo)
num_nodes=1
HOST_NODE_ADDR=localhost:29400       # rendezvous host:port of node 0 when num_nodes > 1
rdzv_timeout_s=600                   # num_nodes > 1: how long the nodes wait for each other to join
max_restarts=0                       # restart training up to N times after a rank dies (resumes the newest checkpoint)
train_engine=torch_ddp               # torch_ddp | deepspeed | torch_fsdp
deepspeed_config=                    # with deepspeed: conf/ds_stage{1,2,3}.json
checkpoint=                          # resume from this epoch_N.pt or step_N.pt; auto: the newest one in $dir
start_over=false                     # true: $dir holds an earlier run, which stage 4 moves into $dir/previous_runs/N/
                                     # (without it, or --checkpoint auto to continue that run, stage 4 refuses the dir)
average_num=3                        # 0: decode the last epoch as is
decode_sets=test                     # test | dev: stage 5 decodes <decode_sets>_<corpus> (tune on dev, score test once)
decode_modes="ctc_greedy_search ctc_prefix_beam_search attention_rescoring"
decoding_chunk_sizes=auto            # stage 5, encoder frames per chunk (-1: full context); auto: "-1 16 8 4" for a
                                     # model trained with dynamic chunks, its static_chunk_size for a static one, else -1
num_decoding_left_chunks=-1          # the chunks before it each chunk sees; -1: all
beam_size=20                         # fewer dev word errors than 10, for a longer stage 5 (docs/recipe_ablation.md)
lm_order=3                           # word n-gram LM from the training transcripts (stage 2); 0: decode without LM
lm_common_words=0                    # the LM's vocabulary adds the N most frequent English words (wordfreq) it lacks
spelling_order=6                     # with the LM: letter n-gram that scores the spelling of its OOV words; 0: none
spelling_common_words=30000          # its words: the training transcripts' and the N most frequent English words
lm_weight=0.30                       # the LM's fusion settings, tuned on the dev sets (docs/recipe_ablation.md)
word_bonus=0.5
length_penalty=2.0                   # attention rescoring: added per token (> 0 favours longer hypotheses; 2.0 offsets
                                     # the rescoring's lean to dropping letters: lower dev CER)
reverse_weight=                      # attention rescoring, decoder bitransformer: the right-to-left score's weight
                                     # in [0, 1]; default: the model's model_conf.reverse_weight
oov_penalty=0
decode_batch_size=32
decode_threads=0                     # per rank; 0: torch's default divided among the ranks of a node
decode_nproc_per_node=               # decoding ranks per node; default: nproc_per_node
cmvn_workers=2

. tools/parse_options.sh

die() { echo "$0: $*" >&2; exit 1; }
[ $# -eq 0 ] || die "unexpected argument '$1': every option takes one value (quote a list: --corpora \"fsdd kathleen\")"
[[ $stage =~ ^-?[0-9]+$ && $stop_stage =~ ^-?[0-9]+$ ]] || die "--stage and --stop_stage must be integers in -1..5"
(( stage >= -1 && stop_stage <= 5 && stage <= stop_stage )) ||
  die "bad stage range $stage..$stop_stage: stages are -1..5 and --stage must not exceed --stop_stage"
case $token_type in char|bpe) ;; *) die "--token_type must be char or bpe, got '$token_type'";; esac
[[ $average_num =~ ^[0-9]+$ ]] || die "--average_num must be a non-negative integer, got '$average_num'"
for opt in beam_size decode_batch_size num_utts_per_shard list_workers cmvn_workers; do
  [[ ${!opt} =~ ^[1-9][0-9]*$ ]] || die "--$opt must be a positive integer, got '${!opt}'"
done
[[ $decode_threads =~ ^[0-9]+$ ]] || die "--decode_threads must be a non-negative integer, got '$decode_threads'"
[[ $lm_order =~ ^(0|[2-6])$ ]] || die "--lm_order must be 0 (no LM) or 2..6 (what KenLM loads), got '$lm_order'"
[[ $spelling_order =~ ^(0|[2-6])$ ]] || die "--spelling_order must be 0 (none) or 2..6 (what KenLM loads), got '$spelling_order'"
for opt in lm_common_words spelling_common_words; do
  [[ ${!opt} =~ ^(0|[1-9][0-9]*)$ ]] || die "--$opt must be a non-negative integer, got '${!opt}'"
done
for opt in lm_weight word_bonus oov_penalty length_penalty; do
  [[ ${!opt} =~ ^[-+]?([0-9]+[.]?[0-9]*|[.][0-9]+)$ ]] || die "--$opt must be a decimal number, got '${!opt}'"
done
[[ $lm_weight != -* ]] || die "--lm_weight must be >= 0, got '$lm_weight'"
[[ -z $reverse_weight || $reverse_weight =~ ^(0+([.][0-9]*)?|0*[.][0-9]+|0*1([.]0*)?)$ ]] ||
  die "--reverse_weight must be a number in [0, 1] (or empty: the model's), got '$reverse_weight'"
[[ $oov_penalty == -* || ! $oov_penalty =~ [1-9] ]] || die "--oov_penalty must be <= 0, got '$oov_penalty'"
[ -n "${corpora// }" ] || die "--corpora is empty"
case $data_type in raw|shard) ;; *) die "--data_type must be raw or shard, got '$data_type'";; esac
case $audio_format in keep|flac|wav) ;; *) die "--audio_format must be keep, flac or wav, got '$audio_format'";; esac
case $decode_sets in test|dev) ;; *) die "--decode_sets must be test or dev, got '$decode_sets'";; esac
[ -f "$train_config" ] || die "--train_config $train_config does not exist"
[[ $max_restarts =~ ^[0-9]+$ && $rdzv_timeout_s =~ ^[1-9][0-9]*$ ]] ||
  die "--max_restarts must be a non-negative integer and --rdzv_timeout_s a positive one"
if [ "$max_restarts" -gt 0 ]; then  # a restarted job resumes where the dead one committed its last checkpoint
  [ -z "$checkpoint" ] || [ "$checkpoint" = auto ] ||
    die "--max_restarts resumes from the newest checkpoint in --dir: copy $checkpoint into a new --dir instead"
  checkpoint=auto
  # NOTE: torchrun's rendezvous store, shared with the workers by default, keeps the dead attempt's keys, so a
  # restarted rank can read a peer address of the attempt before (seen here in 2 of 3 restarts: gloo "connection
  # refused"; pytorch/pytorch#135712). A store per attempt avoids it.
  export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
fi
dict=$data/dict/units.txt
bpemodel=$data/dict/bpe
lm=$data/lm/lm_${lm_order}gram.arpa
[ "$lm_common_words" = 0 ] || lm=$data/lm/lm_${lm_order}gram_${lm_common_words}common.arpa
spelling_lm=$data/lm/spelling_${spelling_order}gram_${spelling_common_words}common.arpa
(( lm_order > 0 )) || spelling_order=0  # the spelling LM scores the word LM's OOV words
eval_sets() { for c in $corpora; do printf '%s_%s ' "$1" "$c"; done; }
decode_dirs=$(eval_sets "$decode_sets")
decode_dirs=${decode_dirs% }
results=$dir/RESULTS.md
[ "$decode_sets" = test ] || results=$dir/RESULTS_$decode_sets.md
SECONDS=0

# The training overrides: stage 1 (features for CMVN) and stage 4 read the config with the same ones.
train_overrides=(--override_config "tokenizer $token_type" --override_config "dataset_conf.data_type $data_type"
                 --override_config "cmvn_conf.cmvn_file $data/train/global_cmvn")
if [ "$token_type" = bpe ]; then
  train_overrides+=(--override_config "tokenizer_conf {symbol_table_path: $dict, bpe_model: $bpemodel.model}")
else
  train_overrides+=(--override_config "tokenizer_conf {symbol_table_path: $dict}")
fi
IFS=';' read -ra extra <<< "$overrides"
for o in "${extra[@]}"; do [ -n "${o// }" ] && train_overrides+=(--override_config "$o"); done
# Checked now by the trainer's --check_only, in one Python start (each is seconds): the decoding modes by the model's
# own list (lm_used: whether one of them decodes with the LM); with stage 4 in the range, the config and overrides
# (the optimizer and LR schedule built on a stand-in parameter: a typo is one line before any work, not one per rank
# and torchrun's traceback), --train_engine with --deepspeed_config, train_conf.dtype on this machine, --checkpoint
# (and the one --checkpoint auto picks: its model against the config's, once the dictionary and CMVN stats exist),
# and what stage 4 would refuse in --dir (an earlier run there, without --checkpoint auto or --start_over), so that the
# averaging is checked against the epochs this run will train, not after them, and a refusal comes before stages
# -1..3; and the number of GPUs.
train_options=(--model_dir "$dir" ${checkpoint:+--checkpoint "$checkpoint"})
[ "$start_over" = false ] || train_options+=(--start_over)
check_config=()
(( stage > 4 || stop_stage < 4 )) || check_config=(--config "$train_config" "${train_overrides[@]}"
  --train_engine "$train_engine" ${deepspeed_config:+--deepspeed_config "$deepspeed_config"} "${train_options[@]}")
checked=$(python -m toolkit.bin.train --check_only --decode_modes "$decode_modes" "${check_config[@]}") || exit 1
read -r max_epoch gpus lm_used <<< "$checked"
(( stage > 4 || stop_stage < 5 || average_num == 0 || max_epoch >= average_num )) ||
  die "--average_num $average_num needs at least $average_num epochs, but train_conf.max_epoch is $max_epoch (lower --average_num, or 0 for the last epoch)"
if [ -z "$nproc_per_node" ]; then
  nproc_per_node=$gpus
  [ "$nproc_per_node" -gt 0 ] || nproc_per_node=2
fi
decode_nproc_per_node=${decode_nproc_per_node:-$nproc_per_node}
[[ $decoding_chunk_sizes == auto || $decoding_chunk_sizes =~ ^(-1|[1-9][0-9]*)( +(-1|[1-9][0-9]*))*$ ]] ||
  die "--decoding_chunk_sizes must be auto or encoder frames per chunk (> 0, or -1 for full context), got '$decoding_chunk_sizes'"
[[ $num_decoding_left_chunks =~ ^(-1|[0-9]+)$ ]] ||
  die "--num_decoding_left_chunks must be -1 (all) or >= 0, got '$num_decoding_left_chunks'"
for n in "$nproc_per_node" "$decode_nproc_per_node" "$num_nodes"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || die "--nproc_per_node, --decode_nproc_per_node and --num_nodes must be positive integers, got '$n'"
done
(( gpus == 0 || (nproc_per_node <= gpus && decode_nproc_per_node <= gpus) )) ||
  die "--nproc_per_node $nproc_per_node / --decode_nproc_per_node $decode_nproc_per_node: this node has $gpus GPU(s), one per process"
if [ "$num_nodes" -gt 1 ]; then  # now: torchrun retries a host it cannot resolve for ~90 s, then ends in a traceback
  rdzv_host=${HOST_NODE_ADDR%:*}
  rdzv_host=${rdzv_host#[}
  getent hosts "${rdzv_host%]}" > /dev/null ||
    die "--HOST_NODE_ADDR $HOST_NODE_ADDR: the host '${rdzv_host%]}' does not resolve on $(hostname); give node 0's name or address as every node resolves it (host:port)"
fi

if (( stage <= 4 && stop_stage >= 4 )); then  # what training reads from the stages before --stage, checked now
  needed=()
  if (( stage > 1 )); then needed+=("$data/train/global_cmvn"); fi
  if (( stage > 2 )); then needed+=("$dict"); [ "$token_type" = char ] || needed+=("$bpemodel.model"); fi
  if (( stage > 3 )); then needed+=("$data/train/data.list" "$data/dev/data.list"); fi
  for f in "${needed[@]}"; do
    [ -f "$f" ] || die "$f is missing: training needs it; run the stages before --stage $stage first"
  done
fi
if (( stage > 2 && stop_stage >= 5 && lm_order > 0 && lm_used )) && [ ! -f "$lm" ]; then  # now, not after training
  die "$lm is missing: run stage 2 (--stage 2), or decode without LM (--lm_order 0)"
fi
if (( stage > 2 && stop_stage >= 5 && spelling_order > 0 && lm_used )) && [ ! -f "$spelling_lm" ]; then
  die "$spelling_lm is missing: run stage 2 (--stage 2 --stop_stage 2), or decode without it (--spelling_order 0)"
fi
if (( stage > 3 && stop_stage >= 5 )); then  # every set to decode, before the first one is
  for x in $decode_dirs; do
    [ -f "$data/$x/data.list" ] || die "$data/$x/data.list is missing: stage 3 writes it for each of --corpora"
  done
fi

if (( stage <= -1 && stop_stage >= -1 )); then
  echo "stage -1: corpora in $corpus_dir: $corpora"
  [ -d "$corpus_dir" ] || die "--corpus_dir $corpus_dir does not exist; point it at a folder holding <corpus>/data/{train,dev,test}"
  for c in $corpora; do
    for s in train dev test; do
      [ -f "$corpus_dir/$c/data/$s/wav.scp" ] || die "$corpus_dir/$c/data/$s/wav.scp is missing (corpus '$c')"
    done
  done
fi

if (( stage <= 0 && stop_stage >= 0 )); then
  echo "stage 0: Kaldi data dirs in $data"
  local/prepare_data.sh "$corpus_dir" "$data" $corpora
fi

if (( stage <= 1 && stop_stage >= 1 )); then
  echo "stage 1: global CMVN from train fbank"
  python tools/compute_cmvn_stats.py --num_workers "$cmvn_workers" --train_config "$train_config" \
    "${train_overrides[@]}" --in_scp "$data/train/wav.scp" --out_cmvn "$data/train/global_cmvn"
fi

if (( stage <= 2 && stop_stage >= 2 )); then
  echo "stage 2: $token_type dictionary $dict"
  mkdir -p "$data/dict"
  if [ "$token_type" = char ]; then
    python tools/make_dict.py "$data/train/text" "$dict"
  else
    python tools/spm_train.py --vocab_size "$nbpe" --model_type "$bpe_mode" "$data/train/text" "$bpemodel"
    cp "$bpemodel.units.txt" "$dict"
  fi
  if [ "$lm_order" -gt 0 ]; then
    echo "stage 2: word $lm_order-gram LM $lm from $data/train/text (+ $lm_common_words common English words)"
    python tools/train_ngram_lm.py --order "$lm_order" --common_words "$lm_common_words" "$data/train/text" "$lm"
  fi
  if [ "$spelling_order" -gt 0 ]; then
    echo "stage 2: spelling $spelling_order-gram LM $spelling_lm from the words of $data/train/text (+ $spelling_common_words common English words)"
    python tools/train_ngram_lm.py --spelling --order "$spelling_order" --common_words "$spelling_common_words" \
      "$data/train/text" "$spelling_lm"
  fi
fi

if (( stage <= 3 && stop_stage >= 3 )); then
  echo "stage 3: $data_type data.list"
  for x in train dev $(eval_sets dev) $(eval_sets test); do
    if [ "$data_type" = raw ]; then
      python tools/make_raw_list.py --audio_format "$audio_format" --audio_dir "$data/$x/audio" \
        --num_workers "$list_workers" "$data/$x/wav.scp" "$data/$x/text" "$data/$x/data.list"
    else
      python tools/make_raw_list.py "$data/$x/wav.scp" "$data/$x/text" "$data/$x/raw.list"
      python tools/make_shard_list.py --num_utts_per_shard "$num_utts_per_shard" --num_workers "$list_workers" \
        --audio_format "$audio_format" "$data/$x/raw.list" "$data/$x/shards" "$data/$x/data.list"
    fi
  done
fi

# The launcher (and so its ranks) ends with this script, even killed with kill -9 (TOOLKIT_STOP_WITH_PARENT)
if [ "$num_nodes" -gt 1 ]; then  # each job below adds --nproc_per_node (and its own --rdzv_id)
  launcher=(env TOOLKIT_STOP_WITH_PARENT=1 python -m toolkit.bin.launch --nnodes="$num_nodes" --rdzv_backend=c10d
            --rdzv_endpoint="$HOST_NODE_ADDR" --rdzv_conf="join_timeout=$rdzv_timeout_s")
else
  launcher=(env TOOLKIT_STOP_WITH_PARENT=1 python -m toolkit.bin.launch --standalone --nnodes=1)
fi
job_id() { [ "$num_nodes" -gt 1 ] && echo "--rdzv_id=toolkit-english-$1"; true; }
# torchrun (toolkit.bin.launch: a refusal of the ranks is one line, not torchrun's traceback), with one line saying
# so when the nodes never met (torchrun itself ends in a RendezvousTimeoutError traceback)
launch() {
  local err rc=0
  err=$(mktemp)
  # stderr through tee into $err (and still to the terminal), stdout untouched
  { "${launcher[@]}" "$@" 2>&1 1>&3 3>&- | tee "$err" >&2; rc=${PIPESTATUS[0]}; } 3>&1 || true
  if [ "$rc" -ne 0 ] && grep -q RendezvousTimeoutError "$err"; then
    echo "$0: not all $num_nodes nodes joined the rendezvous at $HOST_NODE_ADDR within --rdzv_timeout_s" \
      "$rdzv_timeout_s: start the same command on every node" >&2
  fi
  rm -f "$err"
  return "$rc"
}

if (( stage <= 4 && stop_stage >= 4 )); then
  echo "stage 4: training with $train_engine, $num_nodes node(s) x $nproc_per_node process(es)"
  mkdir -p "$dir"
  launch --nproc_per_node="$nproc_per_node" --max_restarts="$max_restarts" $(job_id train) -m toolkit.bin.train \
    --config "$train_config" "${train_overrides[@]}" \
    --train_data "$data/train/data.list" --cv_data "$data/dev/data.list" \
    --tensorboard_dir "$tensorboard_dir" --train_engine "$train_engine" \
    ${deepspeed_config:+--deepspeed_config "$deepspeed_config"} "${train_options[@]}"
fi

if (( stage <= 5 && stop_stage >= 5 )); then
  [ -d "$dir" ] || die "--dir $dir: no such directory (stage 5 decodes the model that stage 4 trained there)"
  if [ "$average_num" -gt 0 ]; then
    decode_checkpoint=$dir/avg_${average_num}.pt
    echo "stage 5: averaging the $average_num best epochs into $decode_checkpoint"
    python -m toolkit.bin.average_model --src_path "$dir" --num "$average_num" --val_best \
      --dst_model "$decode_checkpoint"
  else
    # NOTE: the newest committed epoch by its number (sorting paths as text puts epoch_9 after epoch_10).
    decode_checkpoint=$(python -c 'import sys; from toolkit.utils.checkpoint import list_checkpoints as ls
print((ls(sys.argv[1]) or [""])[-1])' "$dir")
    [ -n "$decode_checkpoint" ] || die "no committed epoch_N.pt (with epoch_N.yaml) in $dir"
    echo "stage 5: decoding the newest epoch as it is: $decode_checkpoint"
  fi
  if [ "$decoding_chunk_sizes" = auto ]; then  # what the model was trained for (its train.yaml's encoder_conf)
    decoding_chunk_sizes=$(python -c 'import sys, yaml; conf = yaml.safe_load(open(sys.argv[1]))["encoder_conf"]
print("-1 16 8 4" if conf.get("use_dynamic_chunk") else conf.get("static_chunk_size") or -1)' "$dir/train.yaml")
  fi
  # The decoding settings get one home, $dir/decode.yaml (with the LM files copied beside it, so that the model dir
  # holds all that decoding reads): recognize.py below, toolkit-transcribe and toolkit.load_model read them from it.
  # Its mode (what transcription uses) is the last of --decode_modes; its chunk size full context when decoded at
  # -1, and the first chunk size > 0 is a stream's.
  chunks=($decoding_chunk_sizes)
  full_chunk=${chunks[0]}
  [[ " $decoding_chunk_sizes " != *" -1 "* ]] || full_chunk=-1
  modes=($decode_modes)
  {
    echo "# written by run.sh stage 5: the recipe's decoding settings (docs/using_a_model.md); an option overrides each"
    echo "checkpoint: $(basename "$decode_checkpoint")"
    echo "mode: ${modes[${#modes[@]}-1]}"
    echo "beam_size: $beam_size"
    echo "length_penalty: $length_penalty"
    [ -z "$reverse_weight" ] || echo "reverse_weight: $reverse_weight"
    echo "decoding_chunk_size: $full_chunk"
    echo "num_decoding_left_chunks: $num_decoding_left_chunks"
    for c in "${chunks[@]}"; do if [ "$c" -gt 0 ]; then echo "streaming_chunk_size: $c"; break; fi; done
  } > "$dir/decode.yaml"
  lm_title=
  if (( lm_order > 0 && lm_used )); then
    mkdir -p "$dir/lm"
    cp "$lm" "$dir/lm/"
    printf 'lm: lm/%s\nlm_weight: %s\nword_bonus: %s\noov_penalty: %s\n' "$(basename "$lm")" "$lm_weight" "$word_bonus" \
      "$oov_penalty" >> "$dir/decode.yaml"
    lm_title=", $lm_order-gram LM (+ $lm_common_words common words) weight $lm_weight bonus $word_bonus penalty $oov_penalty"
    if [ "$spelling_order" -gt 0 ]; then
      cp "$spelling_lm" "$dir/lm/"
      echo "spelling_lm: lm/$(basename "$spelling_lm")" >> "$dir/decode.yaml"
      lm_title+=", spelling $spelling_order-gram (+ $spelling_common_words common words)"
    fi
  fi
  chunk_dir() { if [ "$2" = -1 ]; then echo "$dir/$1"; else echo "$dir/$1/chunk_$2"; fi; }
  echo "stage 5: decoding $decode_dirs with $decode_modes${lm_title}, decoding_chunk_size $decoding_chunk_sizes (left chunks $num_decoding_left_chunks), $num_nodes node(s) x $decode_nproc_per_node process(es)"
  for x in $decode_dirs; do
    for chunk in $decoding_chunk_sizes; do
      # every rank decodes its share; global rank 0 writes <mode>/text, <mode>/wer, <mode>/cer and decode_summary.json
      rm -f "$(chunk_dir "$x" "$chunk")/decode_summary.json"
      # the checkpoint, beam, weights and LM from $dir/decode.yaml
      launch --nproc_per_node="$decode_nproc_per_node" $(job_id "decode-$x-chunk$chunk") -m toolkit.bin.recognize \
        --config "$dir/train.yaml" --test_data "$data/$x/data.list" --result_dir "$(chunk_dir "$x" "$chunk")" \
        --modes $decode_modes --batch_size "$decode_batch_size" --decoding_chunk_size "$chunk" \
        --num_threads "$decode_threads"
    done
  done
  written=1
  for x in $decode_dirs; do
    for chunk in $decoding_chunk_sizes; do [ -f "$(chunk_dir "$x" "$chunk")/decode_summary.json" ] || written=0; done
  done
  if [ "$written" = 1 ]; then
    python tools/results_table.py --data "$data" --dir "$dir" --test_sets $decode_dirs --modes $decode_modes \
      --decoding_chunk_sizes $decoding_chunk_sizes \
      --title "$(basename "$dir") ($(basename "$train_config"), $token_type, $num_nodes x $nproc_per_node $train_engine$lm_title)" \
      > "$results"
    cat "$results"
  else  # NOTE: without a shared file system only the node of global rank 0 holds the decoding results
    echo "stage 5: the results were written on the node of global rank 0 (no $dir/<test set>/decode_summary.json here)"
  fi
fi
echo "$0: stages $stage..$stop_stage done in $((SECONDS / 60)) min $((SECONDS % 60)) s"
