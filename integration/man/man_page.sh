#!/bin/sh
# man_page.sh TOOL NAME SUMMARY OUT: the man page of a vrdma tool, from its own --help (help2man),
# so that the page says what the tool does. A tool with subcommands (CLI11's "Subcommands:"
# list) gets a COMMANDS section with every command's usage, options and subcommands, to any
# depth, each option a tagged paragraph as help2man makes them.
set -eu
tool=$1 name=$2 summary=$3 out=$4
version=$("$tool" --version | sed -n 's/^[^ ]* //p')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The subcommands of `tool ARGS`, from the "Subcommands:" list of its --help.
subcommands() {
  "$tool" "$@" --help | sed -n '/^Subcommands:/,$p' | sed -n 's/^  \([a-z][a-z0-9-]*\)  .*/\1/p'
}
# One command's --help (CLI11's layout: description, "Usage:", "Options:" and "Subcommands:"
# lists with the text from column 31, or on the next line when the name is longer) as roff.
roff() {
  sed -e 's/\\/\\e/g' -e 's/^\([.'"'"']\)/\\\&\1/' | awk '
    function flush() { if (item != "") { print ".TP"; print "\\fB" item "\\fR"; print text }; item = ""; text = "" }
    /^Usage: / { flush(); sub(/^Usage: /, ""); print ".PP"; print "\\fBUsage:\\fR " $0; next }
    /^(Options|Subcommands|Positionals):$/ { flush(); print ".PP"; print "\\fB" $0 "\\fR"; next }
    # A name within 28 columns has its text from column 31; a longer one has it on the next
    # line, indented 30 (then the whole first line is the name).
    /^  [^ ]/ {
      flush(); raw = substr($0, 3); cont = 0
      if (length($0) > 30 && substr($0, 30, 1) == " ") { item = substr($0, 3, 27); text = substr($0, 31) }
      else { item = raw; text = "" }
      sub(/ +$/, "", item)
      next
    }
    /^      +[^ ]/ && item != "" {
      if (cont++ == 0 && text != "") { item = raw; text = "" }
      sub(/^ +/, ""); text = (text == "" ? $0 : text " " $0); next
    }
    /^$/ { flush(); next }
    { flush(); print ".PP"; print }
    END { flush() }'
}
walk() {
  for c in $(subcommands "$@"); do
    printf '.SS "%s"\n' "$(echo "$name $* $c" | sed 's/  */ /g')"
    "$tool" "$@" "$c" --help | roff
    walk "$@" "$c"
  done
}
{
  if [ -n "$(subcommands)" ]; then
    printf '[COMMANDS]\n'
    walk
  fi
  printf '[SEE ALSO]\n.BR vrdmad (8),\n.BR vrdmactl (8),\n.BR vrdma-perf (1),\n.BR pvverbs-bind (8);\n'
  printf 'the guides in /usr/share/doc/vrdma (docs/ in the source): operations.md, integration.md, migration.md.\n'
} > "$tmp/include"
# help2man names the page after the program's file name.
ln -s "$(readlink -f "$tool")" "$tmp/$name"
help2man --no-info --version-string="$version" --name="$summary" --section="${out##*.}" \
  --include="$tmp/include" --output="$out" "$tmp/$name"
