import json,sys,os
# usage: compare.py [DIR [RUN...]]: DIR/<RUN>.json for each RUN (default: this file's folder, and
# old1 new1 ... old4 new4, those that exist)
base=sys.argv[1] if len(sys.argv)>1 else os.path.dirname(os.path.abspath(__file__))
names=sys.argv[2:] or ['old1','new1','old2','new2','old3','new3','old4','new4']
runs=[r for r in names if os.path.exists(f'{base}/{r}.json')]
figs=[('latency','watch_reaction_ms','reaction from the watch event'),('latency','reaction_ms','reaction from the apply'),
('latency','promotion_ms','promotion'),('latency','available_to_current_ms','Available → Current'),('latency','apply_to_ready_ms','apply → Ready'),
('latency','status_lag_ms','status in step (AllAtOnce)'),('latency','rollout_history_events','events per rollout'),
('steps','overshoot_ms','step hold − pause'),('steps','ramp_status_lag_ms','ramp step shown'),('steps','current_status_lag_ms','Progressive Current shown'),
('change_burst','last_created_ms','burst of 20: last Deployment'),('change_burst','created_spread_ms','burst of 20: spread'),('change_burst','all_current_ms','burst of 20: every build Current'),('change_burst','all_ready_ms','burst of 20: every TWD Ready')]
d={r:json.load(open(f'{base}/{r}.json')) for r in runs}
print('| figure (p50 / p95) | '+' | '.join(runs)+' |'); print('|---'*(len(runs)+1)+'|')
for s,k,n in figs:
    cells=[]
    for r in runs:
        v=d[r].get(s,{}).get(k) if isinstance(d[r].get(s),dict) else None
        cells.append('–' if not v or not v.get('n') else f"{v['median']:.0f} / {v['p95']:.0f}")
    print(f'| {n} | '+' | '.join(cells)+' |')
print()
for s,k,n in figs:
    o=[d[r][s][k]['median'] for r in runs if r.startswith('old') and ((d[r].get(s) or {}).get(k) or {}).get('n')]
    w=[d[r][s][k]['median'] for r in runs if r.startswith('new') and ((d[r].get(s) or {}).get(k) or {}).get('n')]
    if not o or not w: continue
    mo=sorted(o)[len(o)//2] if len(o)%2 else sum(sorted(o)[len(o)//2-1:len(o)//2+1])/2
    mw=sorted(w)[len(w)//2] if len(w)%2 else sum(sorted(w)[len(w)//2-1:len(w)//2+1])/2
    overlap = not (min(w)>max(o) or max(w)<min(o))
    print(f"{n}: old {min(o):.0f}-{max(o):.0f} (median {mo:.0f}), new {min(w):.0f}-{max(w):.0f} (median {mw:.0f}), new/old {100*(mw/mo-1):+.0f} %, ranges {'overlap' if overlap else 'apart'}")
