"""One variant. usage: python3 exp.py SPLIT SPEC [warm=HOURS] [rounds=N] [obj=binary|l2] [w=recency_halflife_h]
   [seeds=K] [cat=1] [lgb_param=value ...]
val : fit dev start < 2.025M (labels censored at 2.025M; first `warm` hours of dev left out of the fit set,
      features still computed from the start), validate start >= 2.025M (labels censored at 2.1M). Records the
      validation AUC curve over rounds (every round) -> best round, AUC@N.
test: fit dev start < min test start (labels censored there), `rounds` fixed, report test AUC once."""
import sys
from h2 import *
import sets
sp, spec = sys.argv[1], sys.argv[2]
opt = dict(tail=0,warm=0.0, rounds=400, obj='binary', w=0.0, seeds=1, cat=0)
over = {}
for a in sys.argv[3:]:
    k, v = a.split('=')
    if k in opt: opt[k] = type(opt[k])(float(v)) if isinstance(opt[k], float) else (int(v) if isinstance(opt[k], int) else v)
    else: over[k] = float(v) if '.' in v else int(v)
d = timeline('val' if sp == 'val2' else sp)
if sp == 'val2':  # second forward split inside dev: fit start < 1.95M (censored there), validate [1.95M, 2.025M) censored at 2.025M
    d = dict(d); st0 = d['start']
    d['sec_tr'], d['cens_tr'] = observed(d['tl'], 1_950_000.0); d['sec_ev'], d['cens_ev'] = observed(d['tl'], VAL_CUT)
    d['fitm'] = st0 < 1_950_000.0; d['evm'] = (st0 >= 1_950_000.0) & (st0 < VAL_CUT); d['cut'] = 1_950_000.0
F = sets.frame('val' if sp == 'val2' else sp, spec); cols = list(F.columns)
X = F.to_numpy(np.float32)
st = d['start']
ytr = binary_label(d['sec_tr'], d['cens_tr']); yev = binary_label(d['sec_ev'], d['cens_ev'])
first = st.min()
trm = d['fitm'] & (st >= first + opt['warm'] * HOUR)
if opt['tail']:  # leave out fit rows whose label is not yet decided at the cut (start > cut - 2 h)
    trm &= st <= d['cut'] - LONG
evm = d['evm'] & ~np.isnan(yev)
if opt['obj'] == 'binary':
    ylab = ytr; trm &= ~np.isnan(ytr)
else:  # l2 on log10 observed lifetime, censored rows at their lower bound
    ylab = np.log10(np.maximum(d['sec_tr'], 1.0))
wts = None
if opt['w'] > 0:  # recency weights: 0.5 ** ((cut - start) / halflife)
    wts = 0.5 ** ((d['cut'] - st[trm]) / (opt['w'] * HOUR))
p = dict(PARAMS); p.update(over)
if opt['obj'] == 'l2':
    p.update(objective='regression')
catf = [cols.index('vm_type')] if opt['cat'] else 'auto'
t0 = time.time()
preds = []
curves = []
for k in range(opt['seeds']):
    p['seed'] = 7 + k
    ds = lgb.Dataset(X[trm], ylab[trm], weight=wts, categorical_feature=catf, free_raw_data=False)
    m = lgb.train(p, ds, opt['rounds'])
    if sp in ('val', 'val2'):
        # AUC at every round (raw scores, monotone-equivalent to probabilities)
        raw = np.zeros(evm.sum())
        a = []
        for r in range(opt['rounds']):
            raw = m.predict(X[evm], start_iteration=r, num_iteration=1, raw_score=True) + raw
            if (r + 1) % 5 == 0 or r < 5:
                a.append((r + 1, roc_auc_score(yev[evm], raw)))
        curves.append(a)
    preds.append(m.predict(X[evm], raw_score=True))
P = np.mean(preds, axis=0)
rec = dict(split=sp, spec=spec, opt=opt, params=over, n_features=len(cols), secs=round(time.time() - t0, 1),
           auc_final=roc_auc_score(yev[evm], P), ap_final=average_precision_score(yev[evm], P), n_fit=int(trm.sum()))
if sp in ('val', 'val2'):
    c = np.array([[r, np.mean([cv[i][1] for cv in curves])] for i, (r, _) in enumerate(curves[0])])
    b = int(np.argmax(c[:, 1]))
    rec.update(best_round=int(c[b, 0]), best_auc=float(c[b, 1]), **{f'auc@{int(r)}': round(float(v), 4) for r, v in c if int(r) in (25, 50, 85, 100, 150, 200, 300, 400)})
imp = pd.Series(m.feature_importance('gain'), index=cols).sort_values(ascending=False)
rec['top_gain'] = [f'{k}:{v / imp.sum():.3f}' for k, v in imp.head(10).items()]
print(json.dumps(rec)); log(rec)
if sp == 'test':
    np.save(f'{CACHE}/pred-test-{spec}-{opt["obj"]}.npy', P)
