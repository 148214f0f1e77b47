"""Diagnostic ceiling: AUC of the request-time features when train and evaluation come from the SAME
period (random 5-fold split of the dev period, labels as in dev). Not used to choose anything."""
import numpy as np, lightgbm as lgb
from sklearn.metrics import roc_auc_score
from setup import split
from run import feature_set
from common import binary_label
s = split('azure-val')
X = s['X']
for variant in ['base_notenant', 'on:none-weekday', 'on:glob,vt,bs,vtbs-weekday']:
    cols = feature_set(X, variant, False)
    Xa = X[cols].to_numpy(np.float32)
    # dev-period labels: the validation part's own labels (censored at 2.1M) and the pre-cut labels
    y = binary_label(s['sec_ev'], s['cens_ev'])
    keep = ~np.isnan(y)
    idx = np.where(keep)[0]
    rng = np.random.default_rng(7); rng.shuffle(idx)
    folds = np.array_split(idx, 5)
    aucs = []
    for k in range(5):
        te = folds[k]; tr = np.concatenate([folds[j] for j in range(5) if j != k])
        b = lgb.train(dict(objective='binary', learning_rate=0.05, num_leaves=63, min_data_in_leaf=50, feature_fraction=0.9,
                           bagging_fraction=0.8, bagging_freq=1, lambda_l2=1, num_threads=1, verbosity=-1, seed=7),
                      lgb.Dataset(Xa[tr], y[tr]), 200)
        aucs.append(roc_auc_score(y[te], b.predict(Xa[te])))
    print(variant, len(cols), 'random-split AUC within dev: mean %.4f' % np.mean(aucs), ['%.4f' % a for a in aucs])
