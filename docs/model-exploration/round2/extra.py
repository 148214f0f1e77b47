"""Extra feature blocks.
comp: composition of the VM's own batch (tenant_id group = one tenant's request in one 5-min bin). Treats the
      whole batch as one request known at its start (as batch_size already does):
      comp_nflav = # distinct vm_type in the batch; comp_cores_total = sum of cores over the batch;
      comp_type_share = share of batch members with the VM's vm_type; comp_max_cores = max cores in the batch.
"""
from h2 import *

def build(name, d):
    tl = d['tl']
    if name == 'comp':
        g = tl.groupby('tenant_id')
        f = pd.DataFrame(index=tl.index)
        f['comp_nflav'] = g['vm_type'].transform('nunique').astype(float)
        f['comp_cores_total'] = g['cores'].transform('sum').astype(float)
        n = g['vm_type'].transform('size').astype(float)
        f['comp_type_share'] = tl.groupby(['tenant_id', 'vm_type'])['vm_type'].transform('size') / n
        f['comp_max_cores'] = g['cores'].transform('max').astype(float)
        return f
    if name == 'moh':   # minute of hour of the VM's start: (start_s mod 3600) / 60
        return pd.DataFrame({'minute_of_hour': np.mod(tl['start_s'].to_numpy(float), 3600.0) / 60.0})
    if name == 'pos':   # position in own batch: # members of the same tenant_id with start_s < t (replay order), and / batch_size
        st = tl['start_s'].to_numpy(float)
        order = np.argsort(st, kind='stable')
        r = np.zeros(len(tl)); r[order] = pd.Series(tl['tenant_id'].to_numpy()[order]).groupby(tl['tenant_id'].to_numpy()[order]).cumcount().to_numpy()
        # equal start times: count only strictly earlier starts
        first_eq = pd.Series(r[order]).groupby([tl['tenant_id'].to_numpy()[order], st[order]]).transform('min').to_numpy()
        r[order] = first_eq
        return pd.DataFrame({'pos_in_batch': r, 'pos_frac': r / tl['batch_size'].to_numpy(float)})
    if name == 'bin':   # other arrivals in the current 5-min bin: floor(t/300)*300 <= start_j < t, tenant_j != own
        st = tl['start_s'].to_numpy(float); b0 = np.floor(st / 300.0) * 300.0
        s_sorted = np.sort(st)
        n_all = np.searchsorted(s_sorted, st, 'left') - np.searchsorted(s_sorted, b0, 'left')
        pos = extra_pos(tl)
        own_before = pos
        n_other = n_all - own_before
        # distinct other tenants so far in the bin is costlier; use VM count and 1 h arrivals (t-3600 < start_j < t)
        n_1h = np.searchsorted(s_sorted, st, 'left') - np.searchsorted(s_sorted, st - 3600.0, 'right')
        return pd.DataFrame({'bin_other_arr': n_other.astype(float), 'glob_arr_1h': n_1h.astype(float)})
    if name == 'compon':  # strictly online variant of comp: only batch members with start_s < t, plus the VM itself
        st = tl['start_s'].to_numpy(float); order = np.argsort(st, kind='stable')
        ten = tl['tenant_id'].to_numpy()[order]; vt = tl['vm_type'].to_numpy()[order]; co = tl['cores'].to_numpy(float)[order]
        sto = st[order]
        nfl = np.zeros(len(tl)); sh = np.zeros(len(tl))
        seen = {}
        i = 0; n = len(tl)
        while i < n:   # process groups of equal start time: members with equal start are not known to each other
            j = i
            while j < n and sto[j] == sto[i]:
                j += 1
            for k in range(i, j):
                g = seen.get(ten[k], {})
                cnt = dict(g); cnt[vt[k]] = cnt.get(vt[k], 0) + 1
                nfl[k] = len(cnt); m = sum(cnt.values()); sh[k] = cnt[vt[k]] / m
            for k in range(i, j):
                g = seen.setdefault(ten[k], {}); g[vt[k]] = g.get(vt[k], 0) + 1
            i = j
        f = pd.DataFrame(index=tl.index)
        a = np.empty(n); a[order] = nfl; f['compon_nflav'] = a
        b = np.empty(n); b[order] = sh; f['compon_type_share'] = b
        return f
    raise ValueError(name)

def extra_pos(tl):
    return build('pos', dict(tl=tl))['pos_in_batch'].to_numpy()
