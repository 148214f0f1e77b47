import os
"""Shared harness: data loading, censoring-aware labels, request-time features, metrics, LightGBM fits.

Conventions (see model-exploration.md):
  * a VM's start is known at time t iff start_s < t (strict); its end iff end_s <= t.
  * labels: ObservedLifetime.of(record, data_end) exactly as lifetime-model/src/dataset.rs.
"""
import numpy as np
import pandas as pd
import lightgbm as lgb
from sklearn.metrics import roc_auc_score, average_precision_score

AZ_DEV = os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../../../shared/data/azure-v1-tracegen/trace-dev.csv.gz')
AZ_TEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../../../shared/data/azure-v1-tracegen/trace-test.csv.gz')
HUAWEI = os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../../../shared/data/huawei-east-1-lt/trace.csv.gz')
LONG = 7200.0
DAY, HOUR = 86400.0, 3600.0
KEYSCALE = 1e7  # composite sort key = key_code * KEYSCALE + time (times < 1e7 s)


def load(path):
    d = pd.read_csv(path, dtype={'tenant_id': str, 'vm_type': str})
    d['tenant_id'] = d['tenant_id'].fillna('')
    if 'batch_size' not in d:
        d['batch_size'] = np.nan
    return d


# ---------------------------------------------------------------- labels
def observed(d, data_end):
    """(seconds, censored) as ObservedLifetime::of(record, data_end)."""
    end = d['end_s'].to_numpy(float)
    st = d['start_s'].to_numpy(float)
    done = np.isfinite(end) & (end <= data_end)
    sec = np.where(done, end - st, np.maximum(data_end - st, 0.0))
    return sec, ~done


def binary_label(sec, cens):
    """1 long, 0 short, nan unknown (censored below the threshold)."""
    y = np.where(sec >= LONG, 1.0, 0.0)
    y[cens & (sec < LONG)] = np.nan
    return y


# ---------------------------------------------------------------- metrics
from numba import njit


@njit(cache=True)
def _harrell(ts, ev, pr, m):
    tree = np.zeros(m + 1, np.int64)
    n = len(ts)
    conc = 0.0; total = 0.0; inserted = 0
    i = 0
    while i < n:
        j = i
        while j < n and ts[j] == ts[i]:
            j += 1
        for k in range(i, j):
            if ev[k]:
                r = pr[k]
                le = 0; x = r
                while x > 0:
                    le += tree[x]; x -= x & -x
                lt = 0; x = r - 1
                while x > 0:
                    lt += tree[x]; x -= x & -x
                conc += (inserted - le) + 0.5 * (le - lt); total += inserted
        for k in range(i, j):
            x = pr[k]
            while x <= m:
                tree[x] += 1; x += x & -x
            inserted += 1
        i = j
    return conc / total if total > 0 else np.nan


def harrell_c(time, event, risk_time):
    """Harrell's C of a predicted lifetime `risk_time` (larger = lives longer) vs observed
    (time, event). Comparable pair: T_i < T_j with event_i (equal T not comparable).
    Concordant: pred_i < pred_j; prediction ties count 0.5. O(n log n)."""
    time = np.asarray(time, float); event = np.asarray(event, bool); p = np.asarray(risk_time, float)
    pr = (np.unique(p, return_inverse=True)[1] + 1).astype(np.int64)
    order = np.argsort(-time, kind='stable')
    return _harrell(time[order], event[order], pr[order], int(pr.max()) + 1)


def harrell_c_fast(time, event, pred, max_n=10**9, seed=0):
    """Harrell's C on a fixed random subsample (same seed for every model => same pairs)."""
    n = len(time)
    if n > max_n:
        idx = np.random.default_rng(seed).choice(n, max_n, replace=False)
        time, event, pred = np.asarray(time)[idx], np.asarray(event)[idx], np.asarray(pred)[idx]
    # round predictions to 1e-6 to make the fenwick size manageable
    return harrell_c(time, event, np.round(np.asarray(pred, float), 6))


def evaluate(sec, cens, p_long=None, log_pred=None, quantiles=None, cindex=True):
    """Metrics on one evaluation set. sec/cens: observed lifetime; p_long: P(long); log_pred: predicted
    log10 lifetime (point); quantiles: dict q -> predicted log10 q-quantile."""
    out = {}
    y = binary_label(sec, cens)
    lab = ~np.isnan(y)
    out['n_labelled'] = int(lab.sum()); out['long_share'] = float(np.nanmean(y))
    if p_long is not None:
        out['auc'] = roc_auc_score(y[lab], p_long[lab])
        out['ap'] = average_precision_score(y[lab], p_long[lab])
    event = ~cens
    longm = sec >= LONG
    rank = log_pred if log_pred is not None else p_long
    if cindex and rank is not None:
        out['c_all'] = harrell_c_fast(sec, event, rank)
        out['c_long'] = harrell_c_fast(sec[longm], event[longm], rank[longm])
    if log_pred is not None:
        lt = np.log10(np.maximum(sec, 1.0))
        m = longm & event
        out['mae_log_long_completed'] = float(np.mean(np.abs(log_pred[m] - lt[m])))
        mc = longm & cens  # censored long: only an under-prediction of the lower bound is an error
        err_c = np.maximum(lt[mc] - log_pred[mc], 0.0)
        out['mae_log_long_cens_aware'] = float((np.abs(log_pred[m] - lt[m]).sum() + err_c.sum()) / (m.sum() + mc.sum()))
        out['mae_log_all_completed'] = float(np.mean(np.abs(log_pred[event] - lt[event])))
    if quantiles:
        lt = np.log10(np.maximum(sec, 1.0))
        for q, qp in quantiles.items():
            known = event | (lt >= qp)  # censored with observed >= pred: known above
            out[f'cal_q{q}'] = float(np.mean((lt[known] <= qp[known])))
            out[f'cal_q{q}_long'] = float(np.mean((lt[known & longm] <= qp[known & longm])))
    return out


# ---------------------------------------------------------------- baseline features (as Rust)
def vm_type_codes(train_df, train_sec):
    """Rust categorical_spec: categories with >=10 training examples kept, others -> 'other';
    codes = rank of mean log10(max(observed,1)) ascending (ties by name)."""
    l = np.log10(np.maximum(train_sec, 1.0))
    g = pd.DataFrame({'c': train_df['vm_type'].to_numpy(), 'l': l}).groupby('c')['l'].agg(['count', 'sum'])
    kept = g[g['count'] >= 10]
    other = g[g['count'] < 10]
    means = {c: r['sum'] / r['count'] for c, r in kept.iterrows()}
    means['other'] = other['sum'].sum() / other['count'].sum() if other['count'].sum() > 0 else -np.inf
    ranked = sorted(means.items(), key=lambda kv: (kv[1], kv[0]))
    return {c: float(i) for i, (c, _) in enumerate(ranked)}


def tenant_features(d, window=7 * DAY):
    """Rust TenantHistory.summary when tenant_id = one 5-min batch (all members start within 5 s and
    no VM lives < 30 s, so no member has ended when a later member arrives): in replay order (stable
    sort by start_s), tenant_vms_in_window = tenant_running = #earlier members, long_known = 0,
    long_share and quantiles NaN. Rows with empty tenant: all counts 0, rest NaN."""
    st = d['start_s'].to_numpy(float); en = d['end_s'].to_numpy(float)
    g = d.groupby('tenant_id')['start_s']
    spread = (g.transform('max') - g.transform('min')).to_numpy()
    life = np.where(np.isfinite(en), en - st, np.inf)
    assert np.all(spread < 30.0) and np.nanmin(life) >= 30.0 or d['tenant_id'].eq('').all()
    order = np.argsort(st, kind='stable')
    rank = np.zeros(len(d))
    tmp = pd.DataFrame({'t': d['tenant_id'].to_numpy()[order]})
    rank[order] = tmp.groupby('t').cumcount().to_numpy()
    rank[d['tenant_id'].to_numpy() == ''] = 0.0
    f = pd.DataFrame(index=d.index)
    f['tenant_vms_in_window'] = rank
    f['tenant_long_known'] = 0.0
    for k in ['tenant_long_share', 'tenant_log10_lifetime_p25', 'tenant_log10_lifetime_p50', 'tenant_log10_lifetime_p75']:
        f[k] = np.nan
    f['tenant_running'] = rank
    return f


def base_features(d, codes, with_batch=True):
    f = pd.DataFrame(index=d.index)
    f['cores'] = d['cores'].astype(float)
    f['memory_gib'] = d['memory_gib'].astype(float)
    f['memory_per_core'] = np.where(f['cores'] > 0, f['memory_gib'] / f['cores'], np.nan)
    f['low_priority'] = (d['priority'] == 'low').astype(float)
    t = d['start_s'].to_numpy(float)
    f['hour_of_day'] = np.mod(t, DAY) / HOUR
    f['weekday'] = np.mod(np.floor(t / DAY), 7.0)
    f['vm_type'] = d['vm_type'].map(codes).fillna(codes['other']).astype(float)
    if with_batch:
        f['extra_batch_size'] = d['batch_size'].astype(float)
    return f


# ---------------------------------------------------------------- online "recent history" features
def _comp(key, t):
    return key.astype(np.float64) * KEYSCALE + t


def count_in(sorted_comp, key, lo, hi, lo_side, hi_side):
    """# of sorted events of the same key with time in (lo, hi] / [lo, hi) etc. via sides."""
    return (np.searchsorted(sorted_comp, _comp(key, hi), side=hi_side)
            - np.searchsorted(sorted_comp, _comp(key, lo), side=lo_side)).astype(float)


def online_features(tl, q_idx, key, name, windows=(300, HOUR, 6 * HOUR, DAY), last_n=(16,), lag_windows=(HOUR, 6 * HOUR, DAY),
                    extras=True):
    """Request-time features of `key` for the queries tl.iloc[q_idx].
    tl: timeline DataFrame (all VMs whose starts/ends may be known), columns start_s, end_s (NaN = not
    ended within the data). key: int codes for every timeline row. Queries use t = start_s.
    Known at t: starts with start < t; ends with end <= t.
    """
    s = tl['start_s'].to_numpy(float); e = tl['end_s'].to_numpy(float)
    fin = np.isfinite(e)
    life = e - s
    longv = ~fin | (life >= LONG)  # true long label (only used where it is known at t, see lag features)
    t = s[q_idx]; kq = key[q_idx]
    S = np.sort(_comp(key, s))
    E = np.sort(_comp(key[fin], e[fin]))
    EL = np.sort(_comp(key[fin & (life >= LONG)], e[fin & (life >= LONG)]))
    SL = np.sort(_comp(key[longv], s[longv]))
    out = {}
    n_started = np.searchsorted(S, _comp(kq, t), 'left') - np.searchsorted(S, _comp(kq, -1.0), 'right')
    n_ended = np.searchsorted(E, _comp(kq, t), 'right') - np.searchsorted(E, _comp(kq, -1.0), 'right')
    out[f'{name}_running'] = (n_started - n_ended).astype(float)
    for w in windows:
        wn = f'{int(w)}s' if w < HOUR else f'{int(w // HOUR)}h'
        # arrivals with t-w < start < t
        out[f'{name}_arr_{wn}'] = count_in(S, kq, t - w, t, 'right', 'left')
        if w >= HOUR:
            c = count_in(E, kq, t - w, t, 'right', 'right')  # ends in (t-w, t]
            cl = count_in(EL, kq, t - w, t, 'right', 'right')
            out[f'{name}_done_{wn}'] = c
            out[f'{name}_done_long_share_{wn}'] = np.where(c > 0, cl / np.maximum(c, 1), np.nan)
    # lagged label rate: arrivals in (t-2h-w, t-2h]; each one's long label is known at t
    for w in lag_windows:
        wn = f'{int(w // HOUR)}h'
        a = count_in(S, kq, t - LONG - w, t - LONG, 'right', 'right')
        al = count_in(SL, kq, t - LONG - w, t - LONG, 'right', 'right')
        out[f'{name}_lag_n_{wn}'] = a
        out[f'{name}_lag_long_share_{wn}'] = np.where(a > 0, al / np.maximum(a, 1), np.nan)
    if extras:
        # time since the last known arrival of the key (start < t), NaN if none
        pos = np.searchsorted(S, _comp(kq, t), 'left') - 1
        prev = np.where(pos >= 0, S[np.maximum(pos, 0)], np.nan)
        same = np.floor(prev / KEYSCALE + 1e-9) == kq  # composite belongs to the same key
        same &= pos >= 0
        # recover time: prev - key*KEYSCALE
        out[f'{name}_since_last_arr'] = np.where(same, t - (prev - kq * KEYSCALE), np.nan)
        # arrivals so far in the current 5-min bin: floor(t/300)*300 <= start < t
        b0 = np.floor(t / 300.0) * 300.0
        out[f'{name}_arr_this_bin'] = (np.searchsorted(S, _comp(kq, t), 'left') - np.searchsorted(S, _comp(kq, b0), 'left')).astype(float)
    # last-N completions (end <= t) of the key: log10 lifetime quantiles (lower: sorted[floor(q*(n-1))])
    # and long share; n = min(N, #completions); NaN if none.
    if last_n:
        ords = np.lexsort((e[fin], key[fin]))
        ck = key[fin][ords]; cl = np.log10(np.maximum(life[fin][ords], 1.0)); clong = (life[fin][ords] >= LONG).astype(float)
        Ec = _comp(ck, e[fin][ords])  # sorted
        pos = np.searchsorted(Ec, _comp(kq, t), 'right') - 1  # index of last completion with end <= t
        ok = (pos >= 0) & (ck[np.maximum(pos, 0)] == kq)
        ser = pd.Series(cl)
        grp = pd.Series(ck)
        for N in last_n:
            stats = {}
            g = ser.groupby(grp.values)
            for q in (0.25, 0.5, 0.75):
                stats[q] = g.rolling(N, min_periods=1).quantile(q, interpolation='lower').reset_index(level=0, drop=True).sort_index().to_numpy()
            ls = pd.Series(clong).groupby(grp.values).rolling(N, min_periods=1).mean().reset_index(level=0, drop=True).sort_index().to_numpy()
            pp = np.maximum(pos, 0)
            for q in (0.25, 0.5, 0.75):
                out[f'{name}_last{N}_log_p{int(q * 100)}'] = np.where(ok, stats[q][pp], np.nan)
            out[f'{name}_last{N}_long_share'] = np.where(ok, ls[pp], np.nan)
            out[f'{name}_last1_log'] = np.where(ok, cl[pp], np.nan)
    return pd.DataFrame(out)


def key_codes(tl, cols):
    if not cols:
        return np.zeros(len(tl), np.int64)
    return tl.groupby(list(cols), sort=True, dropna=False).ngroup().to_numpy().astype(np.int64)


# ---------------------------------------------------------------- LightGBM
BASE_PARAMS = dict(learning_rate=0.05, num_leaves=63, min_data_in_leaf=50, feature_fraction=0.9,
                   bagging_fraction=0.8, bagging_freq=1, lambda_l2=1.0, num_threads=1, seed=7,
                   deterministic=True, verbosity=-1)


def fit(Xf, yf, Xv, yv, objective='binary', metric='auc', rounds=300, es=30, **over):
    p = dict(BASE_PARAMS); p.update(objective=objective, metric=metric); p.update(over)
    mf = ~np.isnan(yf); mv = ~np.isnan(yv)
    dtr = lgb.Dataset(Xf[mf], yf[mf], free_raw_data=True)
    dva = lgb.Dataset(Xv[mv], yv[mv], reference=dtr)
    b = lgb.train(p, dtr, num_boost_round=rounds, valid_sets=[dva],
                  callbacks=[lgb.early_stopping(es, verbose=False)] if es else [])
    return b
