"""Time-blocked in-distribution ceiling: dev period cut into 6-h blocks by start_s; leave-one-block-out
(train on all other blocks, past AND future, predict the block). Labels: dev labels censored at 2.1M.
usage: python3 ceiling_blocked.py FEATURESET [rounds]   (FEATURESET: base | name of a column list in sets.py)"""
import sys
from h2 import *
import sets
fs = sys.argv[1]; rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 100
over = {k: int(v) for k, v in (a.split('=') for a in sys.argv[3:])}
PARAMS = dict(PARAMS, **over)
d = timeline('val')
X = sets.matrix('val', fs)
y = binary_label(d['sec_ev'], d['cens_ev'])
st = d['start'];
blk = np.floor((st - 1_800_000.0) / 21600.0).astype(int); blk = np.maximum(blk, 0)
lab = ~np.isnan(y)
pred = np.full(len(y), np.nan); per = []
for b in np.unique(blk):
    te = (blk == b) & lab; tr = (blk != b) & lab
    m = lgb.train(PARAMS, lgb.Dataset(X[tr], y[tr]), rounds)
    pred[te] = m.predict(X[te])
    if len(np.unique(y[te])) > 1:
        per.append(roc_auc_score(y[te], pred[te]))
auc = roc_auc_score(y[lab], pred[lab])
rec = dict(kind='ceiling_blocked6h', features=fs, rounds=rounds, params=over, pooled_auc=auc, mean_block_auc=float(np.mean(per)),
           per_block=[round(a, 4) for a in per])
print(json.dumps(rec)); log(rec)
