import os
"""Validation AUC as a function of boosting rounds (no early stopping), for choosing rounds/params on
the dev validation split. usage: python3 curve.py SPLIT VARIANT [k=v params...]"""
import sys, json
import numpy as np, lightgbm as lgb
from common import *
from setup import split
from run import feature_set

def curve(sp, variant, rounds=400, **over):
    s = split(sp); X = s['X']
    cols = feature_set(X, variant, sp.startswith('huawei'))
    Xa = X[cols].to_numpy(np.float32)
    ytr = binary_label(s['sec_tr'], s['cens_tr']); yev = binary_label(s['sec_ev'], s['cens_ev'])
    trm = (s['fit'] | s['es']) & ~np.isnan(ytr)   # fit on the whole pre-cut period
    evm = s['ev'] & ~np.isnan(yev)
    p = dict(BASE_PARAMS); p.update(objective='binary', metric='auc'); p.update(over)
    ev = {}
    dtr = lgb.Dataset(Xa[trm], ytr[trm]); dva = lgb.Dataset(Xa[evm], yev[evm], reference=dtr)
    lgb.train(p, dtr, rounds, valid_sets=[dva], valid_names=['v'], callbacks=[lgb.record_evaluation(ev)])
    a = np.array(ev['v']['auc'])
    return a

if __name__ == '__main__':
    sp, v = sys.argv[1], sys.argv[2]
    over = {k: float(x) if '.' in x else int(x) for k, x in (a.split('=') for a in sys.argv[3:])}
    a = curve(sp, v, **over)
    pts = [10, 25, 50, 100, 200, 300, 400]
    line = dict(split=sp, variant=v, params=over, best=int(a.argmax()) + 1, best_auc=float(a.max()),
                **{f'auc@{r}': float(a[r - 1]) for r in pts if r <= len(a)})
    print(json.dumps(line))
    open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'curves.jsonl'), 'a').write(json.dumps(line) + '\n')
