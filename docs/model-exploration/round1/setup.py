"""Builds (and caches) the feature matrices for the splits.
   azure-val : fit dev start<2.025M (labels censored at 2.025M; last 10% of that period = early stopping),
               validate dev start>=2.025M (labels censored at 2.1M).
   azure-test: fit dev start<min(test start) (labels censored there; last 10% early stopping), report test
               (labels censored at 2,591,400). Online features from the dev+test timeline.
   huawei-val / huawei-test analogous (see below).
"""
import os, pickle, sys
import numpy as np, pandas as pd
from common import *

CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'cache')
os.makedirs(CACHE, exist_ok=True)

AZ_KEYS = {'glob': [], 'vt': ['vm_type'], 'bs': ['batch_size'], 'vtbs': ['vm_type', 'batch_size']}
HW_KEYS = {'glob': [], 'vt': ['vm_type'], 'cores': ['cores']}


def build(tl, keys, codes, with_batch):
    """All features for every row of the timeline tl (queries = every row, t = its start)."""
    tl = tl.reset_index(drop=True)
    parts = [base_features(tl, codes, with_batch=with_batch)]
    if with_batch:
        parts.append(tenant_features(tl))
    q = np.arange(len(tl))
    for name, cols in keys.items():
        k = key_codes(tl, cols)
        parts.append(online_features(tl, q, k, name))
    return pd.concat([p.reset_index(drop=True) for p in parts], axis=1)


def split(name):
    path = f'{CACHE}/{name}.pkl'
    if os.path.exists(path):
        return pickle.load(open(path, 'rb'))
    if name.startswith('azure'):
        dev = load(AZ_DEV)
        if name == 'azure-val':
            cut, end_eval = 2_025_000.0, 2_100_000.0
            tl = dev
        else:
            test = load(AZ_TEST)
            cut, end_eval = float(test['start_s'].min()), 2_591_400.0
            tl = pd.concat([dev[dev['start_s'] < cut], test], ignore_index=True)
        keys, with_batch = AZ_KEYS, True
    else:
        h = load(HUAWEI)
        first, last = h['start_s'].min(), h['start_s'].max()
        half = first + 0.5 * (last - first)
        if name == 'huawei-val':
            cut, end_eval = 1_000_000.0, half   # fit < 1.0M s, validate [1.0M, half), labels censored at half
            tl = h[h['start_s'] < half].reset_index(drop=True)
        else:
            cut, end_eval = half, float(np.nanmax(h['end_s']))
            tl = h
        keys, with_batch = HW_KEYS, False
    tl = tl.sort_values('start_s', kind='stable').reset_index(drop=True)
    st = tl['start_s'].to_numpy(float)
    tr = st < cut
    first = st.min()
    es_from = first + 0.9 * (cut - first)
    sec_tr, cens_tr = observed(tl, cut)
    sec_ev, cens_ev = observed(tl, end_eval)
    codes = vm_type_codes(tl[tr], sec_tr[tr])
    X = build(tl, keys, codes, with_batch)
    out = dict(X=X, fit=tr & (st < es_from), es=tr & (st >= es_from), ev=~tr,
               sec_tr=sec_tr, cens_tr=cens_tr, sec_ev=sec_ev, cens_ev=cens_ev, cut=cut, end_eval=end_eval,
               start=st, codes=codes)
    pickle.dump(out, open(path, 'wb'))
    return out


if __name__ == '__main__':
    import time
    for n in sys.argv[1:]:
        t0 = time.time(); s = split(n)
        print(n, s['X'].shape, 'fit', s['fit'].sum(), 'es', s['es'].sum(), 'ev', s['ev'].sum(), f'{time.time() - t0:.1f}s')
