import json, glob, statistics, collections, sys
rows = collections.defaultdict(list)
sched = {}
for path in glob.glob('benchmarks/results/h100-2026-11-27-must-not-regress/bench/*/results.jsonl'):
    tree, backend, r = path.split('/')[-2].split('_')
    for line in open(path):
        d = json.loads(line)
        if d.get('impl','').startswith('fuser') and d.get('ms'):
            key = (backend, d['op'], d['shape'], d['dtype'])
            rows[key + (tree,)].append(d['ms'])
            sched[key + (tree,)] = d.get('schedule')
out = []
for key in sorted({k[:4] for k in rows}):
    b, a = rows.get(key + ('before',)), rows.get(key + ('after',))
    if not a or not b:
        out.append((key, None, None, None, 'only ' + ('after' if a else 'before'))); continue
    mb, ma = statistics.median(b), statistics.median(a)
    out.append((key, mb, ma, ma / mb - 1, 'same' if sched[key+('before',)] == sched[key+('after',)] else f"{sched[key+('before',)]} -> {sched[key+('after',)]}"))
for key, mb, ma, d, s in out:
    flag = ' <-- slower' if d is not None and d > 0.02 else ''
    print(f"{key[0]:6} {key[1]:28} {key[2]:12} {key[3]:9} " + (f"{mb*1e3:9.2f} {ma*1e3:9.2f} us {d*100:+6.1f}%" if mb else '') + f"  {s}{flag}")
