#!/bin/sh
# The main job cold and warm (issue 38): `examples/preprocess --cold` N times (default 5); each run maps the
# dataset cold (its files dropped from the page cache and read back from disk, malloc's free memory returned,
# an output never written), then warm (a second fresh output), then times the one-thread floor. So cold / warm
# and map / floor alternate in every run, and the medians are printed as one JSON object on stdout. The
# reference in the same run: the disk, a file of the dataset's size (N x 12,288 bytes) read with O_DIRECT
# (`dd iflag=direct`) right before each run, in rows/s: what a cold map that reads its input from disk can reach.
#   bench/preprocess_cold_warm.sh [PREPROCESS] [RUNS] [-- extra preprocess arguments, e.g. --no-prefault]
# Asserts nothing about time. The per-run lines go to stderr.
set -eu
BIN=${1:-build/examples/preprocess}
RUNS=${2:-5}
[ $# -ge 2 ] && shift 2 || shift $#
[ "${1:-}" = "--" ] && shift
[ -x "$BIN" ] || { echo "preprocess binary '$BIN' not found (cmake --build build --target preprocess)" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/preprocess-cold-warm.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM

rows=20000
prev=""
for a in "$@"; do [ "$prev" = "--rows" ] && rows=$a; prev=$a; done
head -c $((rows * 12288)) /dev/zero > "$work/disk"
sync "$work/disk" 2>/dev/null || sync
i=0
while [ "$i" -lt "$RUNS" ]; do
  disk_s=$(dd if="$work/disk" of=/dev/null bs=8M iflag=direct 2>&1 | sed -n 's/.* copied, \([0-9.]*\) s,.*/\1/p')
  disk=$(awk -v r="$rows" -v s="$disk_s" 'BEGIN { printf "%.0f", r / s }')
  "$BIN" --cold --dir "$work/run" "$@" > "$work/out" 2>&1 || { cat "$work/out" >&2; exit 1; }
  # "  map (cold): 0.52 s, 38461 rows/s, ..."  "  floor: ...: 101234 rows/s"  "... 3.21 s total"
  cold=$(sed -n 's/^  map (cold): [^,]*, \([0-9]*\) rows\/s.*/\1/p' "$work/out")
  warm=$(sed -n 's/^  map (warm): [^,]*, \([0-9]*\) rows\/s.*/\1/p' "$work/out")
  floor=$(sed -n 's/^  floor: .*: \([0-9]*\) rows\/s$/\1/p' "$work/out")
  total=$(sed -n 's/^OK: .*; \([0-9.]*\) s total$/\1/p' "$work/out")
  [ -n "$cold" ] && [ -n "$warm" ] && [ -n "$floor" ] && [ -n "$total" ] || { cat "$work/out" >&2; echo "unexpected output" >&2; exit 1; }
  echo "run $i: cold $cold rows/s, warm $warm rows/s, floor $floor rows/s, end to end $total s, disk $disk rows/s" >&2
  echo "$cold $warm $floor $total $disk" >> "$work/figures"
  i=$((i + 1))
done

median() {  # column $1 of the figures
  cut -d' ' -f"$1" "$work/figures" | sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
ratios() {  # column $1 over column $2, per run
  awk -v a="$1" -v b="$2" '{ printf "%.3f\n", $a / $b }' "$work/figures" | sort -g |
    awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
printf '{"benchmark":"preprocess_cold_warm","runs":%s,"extra_args":"%s",\n' "$RUNS" "$*"
printf ' "median_cold_rows_per_s":%s,"median_warm_rows_per_s":%s,"median_floor_rows_per_s":%s,\n' \
  "$(median 1)" "$(median 2)" "$(median 3)"
printf ' "median_cold_vs_warm":%s,"median_warm_vs_floor":%s,"median_end_to_end_s":%s,\n' \
  "$(ratios 1 2)" "$(ratios 2 3)" "$(median 4)"
printf ' "median_disk_read_rows_per_s":%s,"median_cold_vs_disk_read":%s,"median_warm_vs_disk_read":%s,\n' \
  "$(median 5)" "$(ratios 1 5)" "$(ratios 2 5)"
printf ' "runs_cold_warm_floor_total_disk":[%s]}\n' \
  "$(awk '{ printf "%s[%s,%s,%s,%s,%s]", (NR > 1 ? "," : ""), $1, $2, $3, $4, $5 }' "$work/figures")"
