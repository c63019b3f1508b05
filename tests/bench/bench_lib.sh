# Sourced by the benchmark scripts (tests/bench/*/*.sh): what they share.

# bench_plot NAME TITLE YLABEL SERIES REF REFTITLE: $OUT/NAME.png, a histogram of
# $OUT/NAME.dat ("label value" lines) titled TITLE, its bars named SERIES, with a line at REF
# named REFTITLE, when gnuplot is installed; then says where the JSON is.
bench_plot() {
  local name=$1 title=$2 ylabel=$3 series=$4 ref=$5 reftitle=$6
  if command -v gnuplot >/dev/null; then
    gnuplot -e "set terminal png size 720,400; set output '$OUT/$name.png'; set style data histograms; set style fill solid; set yrange [0:*]; set title '$title'; set ylabel '$ylabel'; plot '$OUT/$name.dat' using 2:xtic(1) title '$series', $ref title '$reftitle' lw 2" || true
  fi
  echo "$name: results in $OUT/$name.json"
}

# bench_veth A B IPA IPB: network namespaces A and B joined by a veth pair (MTU 9000), IPA/24 and
# IPB/24 on its ends, everything up.
bench_veth() {
  local a=$1 b=$2
  ip netns add "$a"; ip netns add "$b"
  ip link add "${a}v" netns "$a" mtu 9000 type veth peer name "${b}v" netns "$b" mtu 9000
  ip -n "$a" addr add "$3/24" dev "${a}v"; ip -n "$b" addr add "$4/24" dev "${b}v"
  ip -n "$a" link set "${a}v" up; ip -n "$b" link set "${b}v" up; ip -n "$a" link set lo up; ip -n "$b" link set lo up
}
