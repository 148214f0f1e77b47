#!/bin/sh
# Reproduces every number of "Round 2" in ../model-exploration.md. LightGBM 4.7.0, num_threads=1, seed 7, deterministic.
# Runs two jobs at a time (the machine has 2 cores). Results -> results.jsonl (one line per run).
set -e
cd "$(dirname "$0")"
rm -rf cache results.jsonl
P=2
run() { xargs -P$P -L1 sh -c 'python3 exp.py $0 "$@" | cut -c1-200'; }
# ---- validation (dev split at 2.025M), round 1 of variants (default params)
python3 exp.py val base rounds=300 | cut -c1-200          # builds the cached timelines/features first
python3 exp.py val base+r_vtbs rounds=300 | cut -c1-200
python3 -c "import sets; [sets.block(s, b) for s in ('val', 'test') for b in ('base', 'comp', 'compon')]"   # feature caches
python3 ceiling_blocked.py base 100 | cut -c1-200
python3 ceiling_blocked.py base+r_vtbs 100 | cut -c1-200
run <<'Q'
val base rounds=300 tail=1
val base rounds=300 warm=24
val base+r_vtbs rounds=300 warm=24
val base+r_vtbs rounds=300 warm=24 tail=1
val base+comp rounds=300
val base+r_vtbs:d1 rounds=300
val base+r_vtbs:h1 rounds=300
val base+r_vtbs:prev rounds=300
val base+r_vtbs:day rounds=300
val base+r_vtbs:rec rounds=300
val base+r_bs rounds=300
val base rounds=300 cat=1
val base rounds=300 obj=l2
val base rounds=300 seeds=5
val base rounds=300 w=24.0
val base rounds=300 w=48.0
val base+comp:nflav rounds=300
val base+comp:type_share rounds=300
val base+comp:cores_total rounds=300
val base+comp+r_vtbs:rec rounds=300
val base+comp rounds=300 tail=1
val2 base rounds=300
val2 base+comp rounds=300
val2 base+comp:type_share rounds=300
val2 base+comp rounds=300 tail=1
val base+comp:type_share,nflav rounds=300
val base+comp+r_sig rounds=300
val base+comp+r_vtsig rounds=300
val base+comp+r_sig:d1 rounds=300
val base+comp+r_sig:prev rounds=300
val base+comp+moh rounds=300
val2 base+comp+moh rounds=300
val base+comp rounds=300 num_leaves=15 min_data_in_leaf=200
val2 base+comp rounds=300 num_leaves=15 min_data_in_leaf=200
val base+comp rounds=300 num_leaves=31
val2 base+comp rounds=300 num_leaves=31
val base+comp rounds=300 cat=1
val2 base+comp rounds=300 cat=1
val base+comp rounds=300 obj=l2
val2 base+comp rounds=300 obj=l2
val2 base rounds=300 obj=l2
val2 base+r_vtbs rounds=300
val base+comp rounds=300 seeds=3 num_leaves=15 min_data_in_leaf=200
val2 base+comp rounds=300 seeds=3 num_leaves=15 min_data_in_leaf=200
val base+comp rounds=300 num_leaves=15 min_data_in_leaf=200 tail=1
val2 base+comp rounds=300 num_leaves=15 min_data_in_leaf=200 tail=1
val2 base+comp+r_vtbs:rec rounds=300
val2 base+comp+r_sig:d1 rounds=300
val base+comp rounds=300 num_leaves=15 min_data_in_leaf=1000
val2 base+comp rounds=300 num_leaves=15 min_data_in_leaf=1000
val base+comp+pos rounds=300 num_leaves=15 min_data_in_leaf=200 tail=1
val2 base+comp+pos rounds=300 num_leaves=15 min_data_in_leaf=200 tail=1
val base+comp+bin rounds=300 num_leaves=15 min_data_in_leaf=200 tail=1
val2 base+comp+bin rounds=300 num_leaves=15 min_data_in_leaf=200 tail=1
val base+comp+-hour_of_day rounds=300 num_leaves=15 min_data_in_leaf=200 tail=1
val2 base+comp+-hour_of_day rounds=300 num_leaves=15 min_data_in_leaf=200 tail=1
val base+comp:type_share,nflav rounds=300 num_leaves=15 min_data_in_leaf=200 tail=1
val2 base+comp:type_share,nflav rounds=300 num_leaves=15 min_data_in_leaf=200 tail=1
val base+comp+r_vtbs rounds=300 num_leaves=15 min_data_in_leaf=200 tail=1
val2 base+comp+r_vtbs rounds=300 num_leaves=15 min_data_in_leaf=200 tail=1
val base rounds=300 num_leaves=15 min_data_in_leaf=200 tail=1
val2 base rounds=300 num_leaves=15 min_data_in_leaf=200 tail=1
val base+comp rounds=300 num_leaves=15 min_data_in_leaf=200 tail=1 warm=12
val2 base+comp rounds=300 num_leaves=15 min_data_in_leaf=200 tail=1 seeds=5
val2 base+comp rounds=300 num_leaves=15 min_data_in_leaf=200 tail=1 warm=12
val base+compon rounds=300 num_leaves=15 min_data_in_leaf=200 tail=1
val2 base+compon rounds=300 num_leaves=15 min_data_in_leaf=200 tail=1
Q
python3 ceiling_blocked.py base+comp 100 | cut -c1-200
python3 ceiling_blocked.py base+comp 150 num_leaves=15 min_data_in_leaf=200 | cut -c1-200
python3 check_comp.py
python3 univariate.py > univariate.out
# ---- test (once): baseline, chosen, strictly-online alternative; then the post-choice diagnostic
python3 exp.py test base rounds=85 | cut -c1-200
python3 exp.py test base+comp rounds=150 num_leaves=15 min_data_in_leaf=200 tail=1 | cut -c1-200
python3 exp.py test base+compon rounds=150 num_leaves=15 min_data_in_leaf=200 tail=1 | cut -c1-200
python3 exp.py test base+comp rounds=85 | cut -c1-200     # diagnostic run after the choice (see notes)
python3 table.py
