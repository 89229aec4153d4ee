#!/bin/bash
# exec peak RSS, two binaries side by side: exec_memory_ab.sh A B ARTIFACT_DIR WORK
# WORK holds large-b4096.safetensors and square-b1024.safetensors (`ane-run host-inputs`
# of golden/images/large.jpg and square.png); one line per case and precision:
# peak RSS in KiB and wall seconds of A and B, and whether their outputs are identical.
A=$1; B=$2; ART=$3; W=$4
for round in 1 2 3; do
 for case in "b4096 large" "b1024 square"; do set -- $case
  for p in fp16 fp32; do
   for r in A B; do BIN=$A; [ $r = B ] && BIN=$B
    /usr/bin/time -f "%M %e" -o $W/t.$r $BIN exec $ART/art.mlpackage --function $1 --inputs $W/$2-$1.safetensors --out $W/o-$r.safetensors --precision $p --runs 1 2>/dev/null
   done
   echo "round $round | $1 | $2 | $p | A $(cat $W/t.A) | B $(cat $W/t.B) | $(cmp -s $W/o-A.safetensors $W/o-B.safetensors && echo identical || echo DIFFERENT)"
  done
 done
done
