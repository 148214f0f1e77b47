"""Brute-force check of the comp / compon features on 300 random VMs per split (naive loops over the raw rows)."""
from h2 import *
import sets
rng = np.random.default_rng(0); bad = 0
for sp in ('val', 'test'):
    d = timeline(sp); tl = d['tl']; F = sets.frame(sp, 'comp+compon')
    ten = tl['tenant_id'].to_numpy(); vt = tl['vm_type'].to_numpy(); co = tl['cores'].to_numpy(float); st = tl['start_s'].to_numpy(float)
    for i in rng.choice(len(tl), 300, replace=False):
        mem = np.where(ten == ten[i])[0]
        exp = dict(comp_nflav=len(set(vt[mem])), comp_cores_total=co[mem].sum(), comp_type_share=np.mean(vt[mem] == vt[i]),
                   comp_max_cores=co[mem].max())
        known = mem[(st[mem] < st[i]) | (mem == i)]
        exp.update(compon_nflav=len(set(vt[known])), compon_type_share=np.mean(vt[known] == vt[i]))
        for k, v in exp.items():
            if not np.isclose(F[k].iloc[i], v):
                bad += 1; print('mismatch', sp, i, k, F[k].iloc[i], v)
print('mismatches:', bad)
