"""Univariate validation AUC (val split) of each base and r_vtbs feature over the VMs where it is not NaN."""
from h2 import *
import sets
d = timeline('val'); F = sets.frame('val', 'base+r_vtbs')
y = binary_label(d['sec_ev'], d['cens_ev']); m = d['evm'] & ~np.isnan(y)
for c in F.columns:
    x = F[c].to_numpy()[m]; ok = ~np.isnan(x)
    if ok.sum() < 100 or len(np.unique(y[m][ok])) < 2: continue
    print(f'{c:22s} coverage {ok.mean():.3f} auc {roc_auc_score(y[m][ok], x[ok]):.3f} long share in covered {y[m][ok].mean():.3f}')
