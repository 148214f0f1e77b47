"""Round-2 harness. Splits, base features, recurring-deployment features (numba), LightGBM helpers.
Known at request time t = start_s of the query VM: other VMs' starts with start_s < t, ends with end_s <= t.
"""
import os, sys, json, pickle, time
import numpy as np, pandas as pd, lightgbm as lgb
from numba import njit
from sklearn.metrics import roc_auc_score, average_precision_score
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '../round1'))
from common import load, observed, binary_label, vm_type_codes, AZ_DEV, AZ_TEST, LONG, DAY, HOUR

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = f'{HERE}/cache'
os.makedirs(CACHE, exist_ok=True)
VAL_CUT, DEV_END, TEST_END = 2_025_000.0, 2_100_000.0, 2_591_400.0


def timeline(name):
    """val: dev only; fit = start < 2.025M (labels censored there), eval = start >= 2.025M (censored 2.1M).
    test: dev start < min test start + test; fit = dev part (censored at min test start), eval = test (censored 2,591,400)."""
    p = f'{CACHE}/tl-{name}.pkl'
    if os.path.exists(p):
        return pickle.load(open(p, 'rb'))
    dev = load(AZ_DEV)
    if name == 'val':
        tl, cut, end_eval = dev, VAL_CUT, DEV_END
    else:
        test = load(AZ_TEST)
        cut, end_eval = float(test['start_s'].min()), TEST_END
        tl = pd.concat([dev[dev['start_s'] < cut], test], ignore_index=True)
    tl = tl.sort_values('start_s', kind='stable').reset_index(drop=True)
    st = tl['start_s'].to_numpy(float)
    sec_tr, cens_tr = observed(tl, cut)
    sec_ev, cens_ev = observed(tl, end_eval)
    tr = st < cut
    codes = vm_type_codes(tl[tr], sec_tr[tr])
    out = dict(tl=tl, cut=cut, end_eval=end_eval, fitm=tr, evm=~tr, sec_tr=sec_tr, cens_tr=cens_tr,
               sec_ev=sec_ev, cens_ev=cens_ev, codes=codes, start=st)
    pickle.dump(out, open(p, 'wb'))
    return out


def base_features(tl, codes):
    f = pd.DataFrame(index=tl.index)
    f['cores'] = tl['cores'].astype(float)
    f['memory_gib'] = tl['memory_gib'].astype(float)
    f['memory_per_core'] = np.where(f['cores'] > 0, f['memory_gib'] / f['cores'], np.nan)
    t = tl['start_s'].to_numpy(float)
    f['hour_of_day'] = np.mod(t, DAY) / HOUR
    f['vm_type'] = tl['vm_type'].map(codes).fillna(codes['other']).astype(float)
    f['batch_size'] = tl['batch_size'].astype(float)
    return f


BASE = ['cores', 'memory_gib', 'memory_per_core', 'hour_of_day', 'vm_type', 'batch_size']


# ------------------------------------------------------------------ recurring-deployment features
@njit(cache=True)
def _setstats(idx, m, s, e, t, out, o):
    """Stats of the VMs idx[:m] as known at t. lb_j = (e_j if e_j <= t else t) - s_j (e_j NaN = not ended).
    out[o+0] n; o+1 share still running (e_j NaN or e_j > t); o+2 log10(max(1, max lb)); o+3 log10(max(1, median lb))
    (median = mean of the two middle values when m is even); o+4 share long among members with s_j <= t - 7200
    (lb >= 7200, exact), NaN if none. All NaN except n when m == 0."""
    out[o] = m
    if m == 0:
        return
    lbs = np.empty(m)
    run = 0; nk = 0; nl = 0
    for k in range(m):
        j = idx[k]
        ej = e[j]
        if ej == ej and ej <= t:
            lb = ej - s[j]
        else:
            lb = t - s[j]; run += 1
        lbs[k] = lb
        if s[j] <= t - 7200.0:
            nk += 1
            if lb >= 7200.0:
                nl += 1
    lbs.sort()
    out[o + 1] = run / m
    out[o + 2] = np.log10(max(1.0, lbs[m - 1]))
    if m % 2 == 1:
        med = lbs[m // 2]
    else:
        med = 0.5 * (lbs[m // 2 - 1] + lbs[m // 2])
    out[o + 3] = np.log10(max(1.0, med))
    if nk > 0:
        out[o + 4] = nl / nk


@njit(cache=True)
def _recur(s, e, ten, kstart, kend, order, qpos, qkey, W, out):
    """order: row indices sorted by (key, start) stable; kstart/kend[key]: range in order. qpos[i]: query row.
    Sets (per query VM q at t = s[q], key K):
      0 day-ago : key-K VMs with t-86400-W <= s_j <= t-86400+W
      1 hour-ago: key-K VMs with t-3600-W  <= s_j <= t-3600+W
      2 prev    : the previous batch of key K: let j* = the key-K VM with the largest s_j < t and tenant != tenant(q)
                  (last in (key,start) order among ties); set = key-K VMs with tenant == tenant(j*) and s_j < t
      3 day     : key-K VMs with t-86400 < s_j <= t-7200   (long label known for all)
      4 recent  : key-K VMs with t-7200 < s_j < t and tenant != tenant(q)
    + out[:, 25] = t - s_{j*} (age of previous batch), NaN if none."""
    nq = len(qpos)
    buf = np.empty(len(s), np.int64)
    for i in range(nq):
        q = qpos[i]; t = s[q]; K = qkey[i]
        a = kstart[K]; b = kend[K]
        ks = s[order[a:b]]
        # 0 day-ago
        lo = np.searchsorted(ks, t - 86400.0 - W, 'left'); hi = np.searchsorted(ks, t - 86400.0 + W, 'right')
        m = 0
        for k in range(lo, hi):
            buf[m] = order[a + k]; m += 1
        _setstats(buf, m, s, e, t, out[i], 0)
        # 1 hour-ago
        lo = np.searchsorted(ks, t - 3600.0 - W, 'left'); hi = np.searchsorted(ks, t - 3600.0 + W, 'right')
        m = 0
        for k in range(lo, hi):
            buf[m] = order[a + k]; m += 1
        _setstats(buf, m, s, e, t, out[i], 5)
        # 2 prev batch
        hi = np.searchsorted(ks, t, 'left')  # s_j < t
        jstar = -1
        k = hi - 1
        while k >= 0:
            j = order[a + k]
            if ten[j] != ten[q]:
                jstar = j; break
            k -= 1
        m = 0
        if jstar >= 0:
            kk = k
            while kk >= 0 and ks[kk] >= s[jstar] - 60.0:
                j = order[a + kk]
                if ten[j] == ten[jstar]:
                    buf[m] = j; m += 1
                kk -= 1
            out[i, 25] = t - s[jstar]
        _setstats(buf, m, s, e, t, out[i], 10)
        # 3 day survival
        lo = np.searchsorted(ks, t - 86400.0, 'right'); hi = np.searchsorted(ks, t - 7200.0, 'right')
        m = 0
        for k in range(lo, hi):
            buf[m] = order[a + k]; m += 1
        _setstats(buf, m, s, e, t, out[i], 15)
        # 4 recent, other batches
        lo = np.searchsorted(ks, t - 7200.0, 'right'); hi = np.searchsorted(ks, t, 'left')
        m = 0
        for k in range(lo, hi):
            j = order[a + k]
            if ten[j] != ten[q]:
                buf[m] = j; m += 1
        _setstats(buf, m, s, e, t, out[i], 20)


SETS = ['d1', 'h1', 'prev', 'day', 'rec']
STATS = ['n', 'run', 'lmax', 'lmed', 'long']


def recur_features(tl, cols, name, W=900.0):
    s = tl['start_s'].to_numpy(float); e = tl['end_s'].to_numpy(float)
    key = tl.groupby(cols, sort=True, dropna=False).ngroup().to_numpy().astype(np.int64)
    ten = tl['tenant_id'].astype('category').cat.codes.to_numpy().astype(np.int64)
    order = np.lexsort((s, key)).astype(np.int64)  # stable by start within key
    nk = key.max() + 1
    ks = key[order]
    kstart = np.searchsorted(ks, np.arange(nk), 'left').astype(np.int64)
    kend = np.searchsorted(ks, np.arange(nk), 'right').astype(np.int64)
    qpos = np.arange(len(tl), dtype=np.int64)
    out = np.full((len(tl), 26), np.nan)
    _recur(s, e, ten, kstart, kend, order, qpos, key, float(W), out)
    names = [f'{name}_{a}_{b}' for a in SETS for b in STATS] + [f'{name}_prev_age']
    return pd.DataFrame(out, columns=names)


# ------------------------------------------------------------------ LightGBM
PARAMS = dict(objective='binary', learning_rate=0.05, num_leaves=63, min_data_in_leaf=50, feature_fraction=0.9,
              bagging_fraction=0.8, bagging_freq=1, lambda_l2=1.0, num_threads=1, seed=7, deterministic=True,
              verbosity=-1)


def log(rec, path=f'{HERE}/results.jsonl'):
    with open(path, 'a') as f:
        f.write(json.dumps(rec, default=float) + '\n')
