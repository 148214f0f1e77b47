#!/bin/sh
# Reproduces every number in ../model-exploration.md (single-threaded LightGBM 4.7.0, seed 7, deterministic).
set -e
cd "$(dirname "$0")"
python3 setup.py azure-val azure-test huawei-val huawei-test          # features, cached in cache/
python3 check_features.py                                             # brute-force check of the online features
# baseline, Rust protocol (fit first 90 % of the pre-cut period, early stopping on the last 10 %)
python3 run.py azure-val base base_notenant
python3 run.py azure-test base                                        # baseline test report
python3 run.py azure-val on:glob on:vt on:bs on:vtbs on:vt,vtbs on:glob,vt,bs,vtbs
python3 run.py azure-val on:none on:none-weekday on:none-weekday-hour_of_day on:vtbs-weekday on:vt,vtbs-weekday on:glob,vt,bs,vtbs-weekday
# validation AUC vs rounds (fit on the whole pre-cut period), used to choose rounds/params
for v in on:none on:none-weekday on:vtbs-weekday on:glob,vt,bs,vtbs-weekday on:glob,vt,bs,vtbs sh:vtbs sh:vt,vtbs sh:glob,vt,bs,vtbs sh:bs,vtbs; do python3 curve.py azure-val $v; done
for v in on:none-weekday on:vtbs-weekday on:vt,vtbs-weekday; do
  python3 curve.py azure-val $v num_leaves=15 min_data_in_leaf=200
  python3 curve.py azure-val $v num_leaves=15 min_data_in_leaf=1000 feature_fraction=0.5
  python3 curve.py azure-val $v num_leaves=63 min_data_in_leaf=1000 feature_fraction=0.5
done
python3 run.py azure-val fixed_rounds=66 on:none-weekday sh:vtbs on:vt,vtbs-weekday
python3 run.py azure-val obj=l2 fixed_rounds=300 on:none-weekday sh:vtbs on:vt,vtbs-weekday
python3 run.py azure-val obj=quantile fixed_rounds=300 on:none-weekday
python3 run.py huawei-val base on:none-weekday on:vt,cores on:glob,vt,cores sh:vt sh:glob,vt,cores
for v in on:none-weekday on:vt,cores-weekday on:glob,vt,cores-weekday sh:vt sh:glob,vt,cores; do python3 curve.py huawei-val $v; done
# final test reports (once)
python3 run.py azure-test fixed_rounds=66 on:none-weekday
python3 run.py azure-test obj=l2 fixed_rounds=300 on:none-weekday
python3 run.py huawei-test base
python3 run.py huawei-test fixed_rounds=41 on:none-weekday
