import os
"""Runs one variant on one split and appends a line to results.jsonl.
usage: python3 run.py SPLIT VARIANT [VARIANT...]"""
import json, sys, time
import numpy as np, pandas as pd
from common import *
from setup import split

BASE = ['cores', 'memory_gib', 'memory_per_core', 'low_priority', 'hour_of_day', 'weekday', 'vm_type']
AZ_BASE = BASE + ['extra_batch_size', 'tenant_vms_in_window', 'tenant_long_known', 'tenant_long_share',
                  'tenant_log10_lifetime_p25', 'tenant_log10_lifetime_p50', 'tenant_log10_lifetime_p75', 'tenant_running']


def cols_of(X, prefixes):
    return [c for c in X.columns if any(c.startswith(p + '_') for p in prefixes)]


def feature_set(X, spec, hw):
    base = BASE if hw else AZ_BASE
    if spec == 'base':
        return base
    if spec == 'base_notenant':
        return [c for c in base if not c.startswith('tenant_')]
    if spec.startswith('on:'):  # on:key1,key2[-pattern...]
        body = spec[3:]
        parts = body.split('-')
        keys = parts[0].split(',')
        cols = [c for c in base if not c.startswith('tenant_')] + cols_of(X, keys)
        for drop in parts[1:]:
            cols = [c for c in cols if drop not in c]
        return cols
    if spec.startswith('sh:'):  # base without weekday + only rate/shape features (no raw counts) of keys
        keys = spec[3:].split(',')
        rate = ('long_share', '_log_p', 'last1_log', 'since_last_arr')
        return [c for c in base if not c.startswith('tenant_') and c != 'weekday'] + \
            [c for c in cols_of(X, keys) if any(r in c for r in rate)]
    raise ValueError(spec)


def run(split_name, variant, objective='binary', params=None, save_pred=False):
    s = split(split_name)
    X = s['X']; hw = split_name.startswith('huawei')
    cols = feature_set(X, variant, hw)
    Xa = X[cols].to_numpy(np.float32)
    params = params or {}
    t0 = time.time()
    res = dict(split=split_name, variant=variant, objective=objective, params=params, n_features=len(cols))
    fit_m, es_m, ev_m = s['fit'], s['es'], s['ev']
    params = dict(params)
    fixed = params.pop('fixed_rounds', None)
    if fixed:  # fit on the whole pre-cut period with a fixed number of rounds (chosen on validation)
        fit_m = s['fit'] | s['es']
        params.update(rounds=int(fixed), es=0)
    ytr = binary_label(s['sec_tr'], s['cens_tr'])
    sec, cens = s['sec_ev'][ev_m], s['cens_ev'][ev_m]
    if objective == 'binary':
        b = fit(Xa[fit_m], ytr[fit_m], Xa[es_m], ytr[es_m], **params)
        p = b.predict(Xa[ev_m], num_iteration=b.best_iteration)
        res.update(evaluate(sec, cens, p_long=p))
        pred = p
    elif objective in ('l2', 'quantile'):
        # regression on log10 observed lifetime; censored training rows use the observed lower bound
        # unless params has 'drop_censored' (then censored rows are dropped) -- both biased, see notes
        lt = np.log10(np.maximum(s['sec_tr'], 1.0))
        drop = params.pop('drop_censored', False) if params else False
        y = lt.copy()
        if drop:
            y[s['cens_tr']] = np.nan
        if objective == 'l2':
            b = fit(Xa[fit_m], y[fit_m], Xa[es_m], y[es_m], objective='regression', metric='l2', **params)
            lp = b.predict(Xa[ev_m], num_iteration=b.best_iteration)
            res.update(evaluate(sec, cens, log_pred=lp))
            pred = lp
        else:
            qs = {}
            for q in (0.1, 0.25, 0.5, 0.75, 0.9):
                b = fit(Xa[fit_m], y[fit_m], Xa[es_m], y[es_m], objective='quantile', metric='quantile', alpha=q, **params)
                qs[q] = b.predict(Xa[ev_m], num_iteration=b.best_iteration)
            res.update(evaluate(sec, cens, log_pred=qs[0.5], quantiles=qs))
            pred = qs[0.5]
    res['best_iter'] = int(b.best_iteration) if b.best_iteration else b.current_iteration()
    res['secs'] = round(time.time() - t0, 1)
    imp = pd.Series(b.feature_importance('gain'), index=cols).sort_values(ascending=False)
    res['top_gain'] = [f'{k}:{v / imp.sum():.3f}' for k, v in imp.head(12).items()]
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results.jsonl'), 'a') as f:
        f.write(json.dumps(res, default=float) + '\n')
    if save_pred:
        np.save(os.path.dirname(os.path.abspath(__file__)) + f'/cache/pred_{split_name}_{variant.replace(":", "_").replace(",", "+")}_{objective}.npy', pred)
    return res


def show(r):
    keys = ['split', 'variant', 'objective', 'n_features', 'auc', 'ap', 'c_all', 'c_long', 'mae_log_long_completed',
            'mae_log_long_cens_aware', 'best_iter', 'secs']
    print(' | '.join(f'{k}={r[k]:.4f}' if isinstance(r.get(k), float) else f'{k}={r.get(k)}' for k in keys if k in r))


if __name__ == '__main__':
    sp = sys.argv[1]
    obj = 'binary'; params = {}
    for v in sys.argv[2:]:
        if v.startswith('obj='):
            obj = v[4:]; continue
        if '=' in v and not v.startswith(('on:', 'sh:')):
            k, x = v.split('='); params[k] = int(x) if x.isdigit() else (x == 'True' if x in ('True', 'False') else float(x)); continue
        r = run(sp, v, objective=obj, params=dict(params))
        show(r); print('   top:', r['top_gain'][:8])
