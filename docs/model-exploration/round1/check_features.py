"""Brute-force check of online_features on random rows (key = (vm_type, batch_size))."""
import numpy as np, pandas as pd
from common import *
from setup import split
import pickle
tl = load(AZ_DEV).sort_values('start_s', kind='stable').reset_index(drop=True)
X = split('azure-val')['X']
s = tl.start_s.to_numpy(); e = tl.end_s.to_numpy(); life = e - s
rng = np.random.default_rng(1)
bad = 0
for i in rng.choice(len(tl), 300, replace=False):
    t = s[i]; same = (tl.vm_type.to_numpy() == tl.vm_type[i]) & (tl.batch_size.to_numpy() == tl.batch_size[i])
    known = same & (s < t)
    ended = same & np.isfinite(e) & (e <= t)
    exp = {'vtbs_running': known.sum() - ended.sum(),
           'vtbs_arr_1h': (same & (s > t - 3600) & (s < t)).sum(),
           'vtbs_done_6h': (ended & (e > t - 6 * 3600)).sum(),
           'vtbs_arr_this_bin': (same & (s >= np.floor(t / 300) * 300) & (s < t)).sum()}
    lag = same & (s > t - 7200 - 86400) & (s <= t - 7200)
    lagl = lag & (~np.isfinite(e) | (life >= 7200))
    exp['vtbs_lag_long_share_24h'] = lagl.sum() / lag.sum() if lag.sum() else np.nan
    idx = np.where(ended)[0]
    if len(idx):
        last = idx[np.argsort(e[idx], kind='stable')][-16:]
        v = np.sort(np.log10(np.maximum(life[last], 1)))
        exp['vtbs_last16_log_p50'] = v[int(np.floor(0.5 * (len(v) - 1)))]
        exp['vtbs_last16_long_share'] = np.mean(life[last] >= 7200)
    prev = np.where(known)[0]
    exp['vtbs_since_last_arr'] = t - s[prev].max() if len(prev) else np.nan
    for k, v in exp.items():
        got = X.loc[i, k]
        if not ((np.isnan(v) and np.isnan(got)) or abs(v - got) < 1e-6):
            bad += 1; print('MISMATCH', i, k, v, got)
print('mismatches', bad)
