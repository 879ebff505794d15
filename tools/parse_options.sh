#!/usr/bin/env bash
# Kaldi-style option parsing for recipe scripts; source it after the defaults are set:
#
#   stage=0
#   nj=2
#   . tools/parse_options.sh || exit 1
#   # now "run.sh --stage 3 --nj 4 extra args" gives stage=3, nj=4 and leaves "extra args" in $@
#
# "--some-name value" sets the shell variable some_name, which the script itself must assign at the start of a
# line ("some_name=default") before sourcing this file; anything else is an error, so typos fail loudly and an
# environment variable (--HOME, --PATH) is never taken for an option. A variable whose default is true or false only accepts true or
# false. Parsing stops at the first argument that does not start with "--", or after "--". "--help" (or -h) prints the
# calling script's leading comment block and exits 0.

while [ $# -gt 0 ]; do
  case "$1" in
    --)  # the end of the options: what follows is left in $@ even if it starts with "--"
      shift
      break ;;
    --help|-h)
      # Print the caller's header: its leading comment lines (a shebang excluded), without the "# ".
      sed -n -e '1{/^#!/d;}' -e '/^#/!q' -e 's/^# \{0,1\}//' -e p "$0"
      exit 0 ;;
    --*)
      name=$(echo "${1#--}" | tr '-' '_')
      if ! [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
        echo "$0: invalid option $1" >&2; exit 1
      fi
      if [ -z "${!name+defined}" ] || ! grep -q "^${name}=" "$0"; then
        echo "$0: unknown option $1 (the script defines no variable '$name')" >&2; exit 1
      fi
      if [ $# -lt 2 ]; then
        echo "$0: option $1 needs a value" >&2; exit 1
      fi
      old_value="${!name}"
      if { [ "$old_value" = true ] || [ "$old_value" = false ]; } && [ "$2" != true ] && [ "$2" != false ]; then
        echo "$0: option $1 takes true or false, got '$2'" >&2; exit 1
      fi
      printf -v "$name" '%s' "$2"
      shift 2 ;;
    *)
      break ;;
  esac
done
unset name old_value
