"""Feature matrices: base + cached extra feature blocks. matrix(split, spec) -> float32 array.
spec: '+'-joined list of names: 'base', 'nobs' (base without batch_size), block names (e.g. 'vtbs' = all
recurrence features of key (vm_type,batch_size)), or 'block:set1,set2' to keep some sets of a block."""
from h2 import *

def batch_signature(tl):
    """Signature of the VM's batch (tenant_id group): sorted 'flavour:count' list, e.g. 'b:3,g:11'."""
    c = tl.groupby(['tenant_id', 'vm_type']).size().reset_index(name='n').sort_values(['tenant_id', 'vm_type'])
    c['tok'] = c['vm_type'] + ':' + c['n'].astype(str)
    sig = c.groupby('tenant_id')['tok'].agg(','.join)
    return tl['tenant_id'].map(sig).to_numpy()

def block(split, name):
    p = f'{CACHE}/feat-{split}-{name}.pkl'
    if os.path.exists(p):
        return pd.read_pickle(p)
    d = timeline(split); tl = d['tl']
    if name == 'base':
        f = base_features(tl, d['codes'])
    elif name.startswith('r_'):   # r_<key>[_W<sec>]
        parts = name[2:].split('_W')
        W = float(parts[1]) if len(parts) > 1 else 900.0
        keycols = {'vtbs': ['vm_type', 'batch_size'], 'bs': ['batch_size'], 'vt': ['vm_type'], 'sig': ['sig'],
                   'vtsig': ['vm_type', 'sig']}[parts[0]]
        if 'sig' in parts[0]:
            tl = tl.copy(); tl['sig'] = batch_signature(tl)
        f = recur_features(tl, keycols, name, W=W)
    else:
        import extra
        f = extra.build(name, d)
    f = f.reset_index(drop=True)
    f.to_pickle(p)
    return f

def frame(split, spec):
    parts = []
    for item in spec.split('+'):
        if item == 'base':
            parts.append(block(split, 'base'))
        elif ':' in item:
            nm, keep = item.split(':'); keep = keep.split(',')
            f = block(split, nm)
            parts.append(f[[c for c in f.columns if any(c.startswith(f'{nm}_{k}_') or c == f'{nm}_{k}' for k in keep)]])
        elif item.startswith('-'):
            parts[0] = parts[0].drop(columns=[item[1:]])
        else:
            parts.append(block(split, item))
    return pd.concat(parts, axis=1)

def matrix(split, spec):
    return frame(split, spec).to_numpy(np.float32)
