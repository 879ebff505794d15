#!/usr/bin/env bash
# The default recipe, end to end: trains and decodes on the shipped real speech in corpora/.
# All options are those of examples/english/s0/run.sh (outputs go to examples/english/s0/{data,exp}; relative
# paths given as options are relative to examples/english/s0):
#   bash run.sh                              # stages -1..5
#   bash run.sh --stage 4 --stop_stage 5
exec bash "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/examples/english/s0/run.sh" "$@"
