# bash completion for vrdma's tools (vrdmactl, vrdmad, vrdma-perf, pvverbs-bind): the commands
# and options come from the tool's own --help (CLI11's "Subcommands:" and "Options:" lists) for
# the command line typed so far, so they are always the installed tool's.
# Installed as /usr/share/bash-completion/completions/<tool>; bash-completion loads it on demand.

# The words of the "Subcommands:" or "Options:" list of `$@ --help`.
_vrdma_help_words() {
  local list=$1
  shift
  "$@" --help 2>/dev/null | awk -v list="$list" '
    /^[A-Z][A-Za-z]*:$/ { on = ($0 == list ":"); next }
    on && /^  [^ ]/ {
      split(substr($0, 3), f, " ")
      n = split(f[1], names, ",")
      for (i = 1; i <= n; i++) { w = names[i]; sub(/=.*/, "", w); print w }
    }'
}

_vrdma_complete() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
  local tool=${COMP_WORDS[0]} i w
  local -a path=("$tool")
  # The command path: the words so far that are subcommands of what came before them.
  for ((i = 1; i < COMP_CWORD; i++)); do
    w=${COMP_WORDS[i]}
    [[ $w == -* ]] && continue
    if _vrdma_help_words Subcommands "${path[@]}" | grep -qx -- "$w"; then path+=("$w"); fi
  done
  case $prev in
    --xml|--report|--journal|--ledger|--sysfs-root|--dir|--socket|--control|--end-file) COMPREPLY=($(compgen -f -- "$cur")); return ;;
  esac
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$(_vrdma_help_words Options "${path[@]}")" -- "$cur"))
  else
    COMPREPLY=($(compgen -W "$(_vrdma_help_words Subcommands "${path[@]}")" -- "$cur"))
  fi
}

complete -F _vrdma_complete vrdmactl vrdmad vrdma-perf pvverbs-bind
