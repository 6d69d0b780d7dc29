#!/usr/bin/env bash
# Regenerates the committed reproductions of both papers' Figure 1 (run from the repository root,
# with ../shared/data beside it). bert-base-cased weights are not available offline, so the
# pretrained panels use all-MiniLM-L6-v2 (a real pretrained BERT; titled as such in every figure).
# Where the hub is reachable, the real ones are:  approx-bench --figure skyformer --model pretrained
set -euo pipefail
BIN=${BIN:-./target/release/approx-bench}
DATA=../shared/data
CORPUS=(--corpus $DATA/wikitext-2/wiki.test.raw)
INIT=(--model initialized --model-dir $DATA/bert-base-cased "${CORPUS[@]}")
PRE=(--model pretrained --model-dir $DATA/all-MiniLM-L6-v2 "${CORPUS[@]}")
for fig in skyformer skeinformer; do
  $BIN --figure $fig "${INIT[@]}" --windows 64 --out results/$fig-fig1/initialized --quiet
  $BIN --figure $fig "${PRE[@]}" --windows 64 --out results/$fig-fig1/pretrained-minilm --quiet
  $BIN plot --from results/$fig-fig1/initialized --from results/$fig-fig1/pretrained-minilm --out results/$fig-fig1
  rm -f results/$fig-fig1/*/*.png
  # The same figure with each point the median trial (Skyformer's pretrained curves are heavy-tailed).
  $BIN plot --from results/$fig-fig1/initialized --from results/$fig-fig1/pretrained-minilm --out results/$fig-fig1/median --statistic median
  mv results/$fig-fig1/median/$fig-fig1-median.png results/$fig-fig1/ && rm -rf results/$fig-fig1/median
  other=$([ $fig = skyformer ] && echo skeinformer || echo skyformer)
  rm -f results/$fig-fig1/$other-fig1.png   # the other paper's figure from this data is partial
done
$BIN anchors --from results/skyformer-fig1/initialized --from results/skeinformer-fig1/initialized > results/anchors-initialized.md
$BIN anchors --from results/skyformer-fig1/pretrained-minilm --from results/skeinformer-fig1/pretrained-minilm > results/anchors-pretrained-minilm.md
