#!/usr/bin/env bash
# Start one command on every host of a hostfile over ssh (torchrun must run on every node), with the same
# rendezvous settings, each host's output streamed with its name in front; when one host's command fails, the
# others are stopped and the launcher exits with that host's status.
#
#   tools/launch_nodes.sh --hostfile hosts -- \
#     'bash run.sh --stage 4 --stop_stage 4 --num_nodes $NUM_NODES --HOST_NODE_ADDR $HOST_NODE_ADDR'
#   tools/launch_nodes.sh --hostfile hosts --dry_run true -- 'bash run.sh ...'   # print the ssh lines only
#
# hostfile: one ssh destination per line ([user@]host, or ssh://[user@]host[:port]); blank lines and '#' comments are
# ignored; the first host is node 0 and holds the rendezvous, at the address ssh connects to for it: the hostname of
# `ssh -G <line>` (so a ~/.ssh/config Host alias gives its HostName), or, where ssh cannot say (not installed), the
# line's host part (no user, no ssh port); an IPv6 literal, written bare as ssh takes it, is bracketed:
# [fe80::1]:29400. The launcher's first line on stderr says which address it derived from which line. A line that
# is no ssh destination (host:port, an address in brackets, more than one field) stops the launcher with one line
# naming it. Quote the command, so that $NUM_NODES, $NODE_RANK and $HOST_NODE_ADDR are expanded on
# each host, where the launcher sets them. On each host the command runs in this directory (the same path on every
# host: a shared disk, or the same checkout) with this PATH (so the same venv), OMP_NUM_THREADS, and every NCCL_*,
# GLOO_*, TP_* and TORCH_* variable set here (network interface choices such as GLOO_SOCKET_IFNAME); see
# docs/multi-gpu-and-nodes.md, "Several machines".
set -euo pipefail

hostfile=
port=29400                      # rendezvous port on the first host
host_node_addr=                 # default: <first host's address>:<port>; set it when nodes reach node 0 otherwise
resolve="ssh -G"                # prints ssh's settings for a destination; its "hostname" line: where ssh connects
ssh="ssh -tt -o BatchMode=yes"  # -tt: closing the connection hangs up the remote command too
dry_run=false

. "$(dirname "${BASH_SOURCE[0]}")/parse_options.sh"

die() { echo "$0: $*" >&2; exit 1; }
[ -n "$hostfile" ] || die "--hostfile is required"
[ -f "$hostfile" ] || die "--hostfile $hostfile: no such file"
[ $# -gt 0 ] || die "no command given (after --)"
# The network address of ssh destination $1: its host part, an IPv6 literal in brackets; fails (status 1, the
# reason on stdout) for what ssh would not take as a destination.
address_of() {
  local host=${1#ssh://}
  host=${host##*@}
  if [[ $1 == ssh://* ]]; then  # ssh://[user@]host[:port]: drop the port
    if [[ $host == \[*\]* ]]; then host=${host%%]*}]; else host=${host%%:*}; fi
  elif [[ $host == \[* ]]; then
    echo "ssh takes no address in brackets; write the IPv6 address bare, ${host//[\[\]]/}"; return 1
  elif [[ $host == *:*:* ]]; then
    host="[$host]"  # an IPv6 literal: torchrun's endpoint is [address]:port
  elif [[ $host == *:* ]]; then
    echo "ssh takes no host:port; write ssh://$1 or set Port in ~/.ssh/config"; return 1
  fi
  if [[ -z $host || $host =~ [[:space:]] ]]; then
    echo "not one ssh destination ([user@]host): one host per line, nothing else"; return 1
  fi
  echo "$host"
}

hosts=()
line_no=0
while IFS= read -r line || [ -n "$line" ]; do
  line_no=$((line_no + 1))
  line=${line%%#*}
  line=${line#"${line%%[![:space:]]*}"}
  line=${line%"${line##*[![:space:]]}"}
  [ -n "$line" ] || continue
  address=$(address_of "$line") || die "$hostfile:$line_no: '$line': $address"
  [ "${#hosts[@]}" -gt 0 ] || first="$address $line_no $line"
  hosts+=("$line")
done < "$hostfile"
[ "${#hosts[@]}" -gt 0 ] || die "--hostfile $hostfile lists no host"
if [ -z "$host_node_addr" ]; then  # node 0's address as ssh itself derives it (aliases, %h in HostName, Match)
  read -r address line_no line <<< "$first"
  how="its host part: '$resolve' gave no hostname"
  # shellcheck disable=SC2086  # $resolve is a command line
  name=$($resolve "$line" 2> /dev/null < /dev/null | awk '$1 == "hostname" { print $2; exit }') || true
  if [ -n "$name" ]; then
    how="$resolve $line: hostname $name"
    address=$name
    [[ $address != *:* ]] || address="[$address]"
  fi
  host_node_addr="$address:$port"
  echo "$0: rendezvous at $host_node_addr, derived from $hostfile:$line_no '$line' ($how)" >&2
fi

exports=("cd $(printf %q "$PWD")")
for name in PATH VIRTUAL_ENV OMP_NUM_THREADS $(compgen -e | grep -E '^(NCCL_|GLOO_|TP_|TORCH_)' || true); do
  [ -n "${!name+set}" ] && exports+=("export $name=$(printf %q "${!name}")")
done
exports+=("export NUM_NODES=${#hosts[@]} HOST_NODE_ADDR=$(printf %q "$host_node_addr")")

declare -A host_of=()
for rank in "${!hosts[@]}"; do
  host=${hosts[$rank]}
  remote="$(IFS=';'; echo "${exports[*]}"); export NODE_RANK=$rank; $*"
  if [ "$dry_run" = true ]; then
    echo "$ssh $(printf %q "$host") $(printf %q "$remote")"
    continue
  fi
  # Its own process group per host, so that stopping a host stops its ssh and the prefixing together; and a
  # watchdog in it that stops the group once this launcher is gone (a kill -9 runs no trap: the ssh sessions, and
  # the jobs they hold open on the hosts, would run on with nobody to stop them).
  # NOTE: the prefix is printed by bash, not spliced into a sed expression, which a '/' (ssh://) or '&' would break.
  setsid bash -c '{ while kill -0 "$3" 2> /dev/null; do sleep 1; done; kill -TERM 0; } & watchdog=$!
    $0 "$1" "$2" < /dev/null 2>&1 | while IFS= read -r l || [ -n "$l" ]; do printf "[%s] %s\n" "$1" "$l"; done
    status=${PIPESTATUS[0]}; kill "$watchdog"; exit "$status"' \
    "$ssh" "$host" "$remote" "$$" &
  host_of[$!]=$host
done
[ "$dry_run" = true ] && exit 0

stop_all() { for pid in "${!host_of[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done; }
trap 'stop_all; exit 130' INT TERM
while [ "${#host_of[@]}" -gt 0 ]; do
  status=0
  wait -n -p finished "${!host_of[@]}" || status=$?
  host=${host_of[$finished]}
  unset "host_of[$finished]"
  if [ "$status" -ne 0 ]; then
    echo "$0: $host exited with status $status; stopping the other hosts" >&2
    stop_all
    wait || true
    exit "$status"
  fi
done
