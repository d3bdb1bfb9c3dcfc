#!/bin/sh
# tdx convert throughput, memmap -> h5 and h5 -> memmap, against `cp` of the same bytes in the same run.
#   bench/tdx_convert.sh [TDX] [MIB]      TDX: the tdx binary (default build/api/tools/tdx), MIB: data size (256)
# Prints one JSON object on stdout (asserts nothing about time). The data is a memmap directory written
# here (obs float32 [N, 256], 1 KiB a row, and idx int64 [N]), in a temporary directory removed at the end.
# Every figure includes the process start of tdx (~0.6 s for a torch-linked binary) and its page-cache state:
# the source was just written, so every copy reads from the page cache.
set -eu
TDX=${1:-build/api/tools/tdx}
MIB=${2:-256}
[ -x "$TDX" ] || { echo "tdx binary '$TDX' not found (cmake --build build --target tdx)" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/tdx-convert-bench.XXXXXX")
trap 'cat "$work"/log* >&2 2>/dev/null; rm -rf "$work"' EXIT INT TERM

rows=$((MIB * 1024))
mkdir "$work/src"
head -c $((rows * 1024)) /dev/urandom > "$work/src/obs.memmap"
head -c $((rows * 8)) /dev/zero > "$work/src/idx.memmap"
cat > "$work/src/meta.json" <<JSON
{"obs": {"device": "cpu", "shape": [$rows, 256], "dtype": "torch.float32", "is_nested": false}, "idx": {"device": "cpu", "shape": [$rows], "dtype": "torch.int64", "is_nested": false}, "shape": [$rows], "device": "cpu", "_type": "<class 'tensordict._td.TensorDict'>"}
JSON
bytes=$((rows * 1024 + rows * 8))

now() { date +%s.%N; }
rate() { awk -v b="$bytes" -v s="$1" 'BEGIN { printf "%.1f", b / 1e6 / s }'; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

t0=$(now); cp -r "$work/src" "$work/cp1"; t1=$(now)
cp_s=$(secs "$t0" "$t1")
rm -rf "$work/cp1"

t0=$(now); "$TDX" convert "$work/src" "$work/a.h5" --quiet 2> "$work/log1"; t1=$(now)
mm_h5_s=$(secs "$t0" "$t1")
t0=$(now); "$TDX" convert "$work/a.h5" "$work/back" --quiet 2> "$work/log2"; t1=$(now)
h5_mm_s=$(secs "$t0" "$t1")
cmp -s "$work/src/obs.memmap" "$work/back/obs.memmap" && same=true || same=false

tdx_rate() { sed -n 's/.*: \([0-9.]*\) MB\/s.*/\1/p' "$1"; }
printf '{"benchmark":"tdx_convert","bytes":%s,"rows":%s,' "$bytes" "$rows"
printf '"cp":{"s":%s,"MB_per_s":%s},' "$cp_s" "$(rate "$cp_s")"
printf '"memmap_to_h5":{"s":%s,"MB_per_s":%s,"copy_loop_MB_per_s":%s},' "$mm_h5_s" "$(rate "$mm_h5_s")" "$(tdx_rate "$work/log1")"
printf '"h5_to_memmap":{"s":%s,"MB_per_s":%s,"copy_loop_MB_per_s":%s},' "$h5_mm_s" "$(rate "$h5_mm_s")" "$(tdx_rate "$work/log2")"
printf '"round_trip_identical":%s}\n' "$same"
