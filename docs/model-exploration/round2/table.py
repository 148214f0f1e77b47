"""Prints results.jsonl as the table of model-exploration.md (Round 2)."""
import json, sys
path = sys.argv[1] if len(sys.argv) > 1 else 'results.jsonl'
for l in open(path):
    r = json.loads(l)
    if 'kind' in r:
        print(f"ceiling {r['features']} rounds={r['rounds']} {r.get('params', {})}: pooled {r['pooled_auc']:.4f}, mean of blocks {r['mean_block_auc']:.4f}"); continue
    o = r['opt']; p = r['params']
    dflt = dict(tail=0, warm=0.0, rounds=300, obj='binary', w=0.0, seeds=1, cat=0)
    tag = ' '.join(f'{k}={v}' for k, v in o.items() if dflt.get(k) != v) + ' ' + ' '.join(f'{k}={v}' for k, v in p.items())
    if r['split'] == 'test':
        print(f"TEST {r['spec']} {tag}: AUC {r['auc_final']:.4f} AP {r['ap_final']:.4f}"); continue
    print(f"| {r['split']} | {r['spec']} | {tag.strip()} | {r['n_features']} | {r['best_round']} → {r['best_auc']:.4f} | " +
          ' / '.join(f"{r.get(k, float('nan')):.4f}" for k in ['auc@50', 'auc@100', 'auc@150', 'auc@200', 'auc@300']) + ' |')
